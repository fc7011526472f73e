//! Protobuf: the payload read as the message's canonical JSON mapping (proto3 JSON), encoded as the
//! message, after the Confluent message-index array.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! protox compiles the registered `.proto` and the files it imports at run time (the registry's
//! references, each under the import path it names; Google's well-known types built in), prost-reflect
//! reads the JSON into a dynamic message. The message written is the schema's first top-level message,
//! which Confluent's serializers index as `[0]` and frame with the single byte `0x00`; nested and imported
//! messages are fields of it. Unknown JSON fields are a mismatch (never dropped).

use std::collections::HashMap;

use prost::Message as _;
use prost_reflect::{DynamicMessage, MessageDescriptor};

use super::avro::Mismatch;

/// A compiled `.proto` and the message rows are written as.
#[derive(Debug)]
pub struct ProtobufCodec {
    message: MessageDescriptor,
}

/// Serves the registered schema and its references to protox by name.
struct Sources(HashMap<String, String>);

impl protox::file::FileResolver for Sources {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        match self.0.get(name) {
            Some(source) => protox::file::File::from_source(name, source),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

/// What the main schema is called while compiling (a name no reference uses).
const MAIN: &str = "outbox-cdc/registered.proto";

impl ProtobufCodec {
    /// Compiles `schema`; `references` are (import path, source) of the files it imports.
    ///
    /// # Errors
    /// protox's diagnosis, or a schema without a message.
    pub fn parse(schema: &str, references: &[(String, String)]) -> Result<Self, String> {
        let mut files: HashMap<String, String> = references.iter().cloned().collect();
        files.insert(MAIN.to_string(), schema.to_string());
        let mut resolver = protox::file::ChainFileResolver::new();
        resolver.add(Sources(files));
        resolver.add(protox::file::GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler.open_file(MAIN).map_err(|e| e.to_string())?;
        let pool = compiler.descriptor_pool();
        let file = pool.get_file_by_name(MAIN).ok_or("the compiled schema is missing")?;
        let message = file.messages().next().ok_or("the schema defines no message")?;
        Ok(ProtobufCodec { message })
    }

    /// The full name of the message rows are written as.
    pub fn message_name(&self) -> &str {
        self.message.full_name()
    }

    /// Appends the message-index array (`[0]`: one zero byte) and the message read from `text` to `out`.
    ///
    /// # Errors
    /// Where the JSON does not fit the message, with prost-reflect's reason.
    pub fn encode(&self, text: &str, out: &mut Vec<u8>) -> Result<(), Mismatch> {
        let mut json = serde_json::Deserializer::from_str(text);
        let mut track = serde_path_to_error::Track::new();
        let read = DynamicMessage::deserialize(
            self.message.clone(),
            serde_path_to_error::Deserializer::new(&mut json, &mut track),
        );
        let message = match read {
            Ok(message) => message,
            Err(e) => return Err(at_path(track.path(), e.to_string())),
        };
        out.push(0);
        message.encode(out).expect("a Vec grows as needed");
        Ok(())
    }
}

/// A mismatch at serde_path_to_error's path.
fn at_path(path: serde_path_to_error::Path, reason: String) -> Mismatch {
    use serde_path_to_error::Segment;
    let segments: Vec<Segment> = path.iter().cloned().collect();
    let mut mismatch = Mismatch::new(reason);
    for segment in segments.into_iter().rev() {
        mismatch = match segment {
            Segment::Seq { index } => mismatch.in_item(index),
            Segment::Map { key } => mismatch.in_field(&key),
            Segment::Enum { variant } => mismatch.in_field(&variant),
            Segment::Unknown => mismatch,
        };
    }
    mismatch
}

#[cfg(test)]
mod tests {
    use super::*;

    const MONEY: &str = r#"syntax = "proto3"; package acme; message Money { string currency = 1; int64 units = 2; }"#;
    const ORDER: &str = r#"syntax = "proto3"; package acme.orders; import "acme/money.proto";
        import "google/protobuf/timestamp.proto";
        message OrderCreated {
          message Line { string sku = 1; int32 qty = 2; }
          enum Status { NEW = 0; PAID = 1; }
          string order_id = 1; repeated Line lines = 2; acme.Money total = 3; Status status = 4;
          google.protobuf.Timestamp placed_at = 5; map<string, string> attributes = 6;
        }
        message Other { string x = 1; }"#;

    fn codec() -> ProtobufCodec {
        ProtobufCodec::parse(ORDER, &[("acme/money.proto".to_string(), MONEY.to_string())]).unwrap()
    }

    /// The first message, nested and imported messages, a well-known type, from canonical JSON; the
    /// bytes read back with prost-reflect's decoder equal the JSON.
    #[test]
    fn canonical_json_becomes_the_first_message() {
        let codec = codec();
        assert_eq!(codec.message_name(), "acme.orders.OrderCreated");
        let json = r#"{"orderId": "o-1", "lines": [{"sku": "A", "qty": 2}], "total": {"currency": "CHF", "units": "12"},
            "status": "PAID", "placedAt": "2026-12-03T12:34:56.123Z", "attributes": {"k": "v"}}"#;
        let mut out = Vec::new();
        codec.encode(json, &mut out).unwrap();
        assert_eq!(out[0], 0, "message index [0]");
        let read = DynamicMessage::decode(codec.message.clone(), &out[1..]).unwrap();
        let back: serde_json::Value = serde_json::to_value(&read).unwrap();
        let want: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(back, want);
    }

    #[test]
    fn mismatches_name_the_path() {
        for (json, path) in [
            (r#"{"lines": [{"sku": "A"}, {"qty": "many"}]}"#, "$.lines[1].qty"),
            // An unknown field is reported at its object, the reason naming it.
            (r#"{"total": {"cents": 1}}"#, "$.total"),
            (r#"{"status": "LOST"}"#, "$.status"),
        ] {
            let mismatch = codec().encode(json, &mut Vec::new()).unwrap_err();
            assert_eq!(mismatch.path(), path, "{json}: {mismatch}");
        }
        let unknown = codec().encode(r#"{"total": {"cents": 1}}"#, &mut Vec::new()).unwrap_err();
        assert!(unknown.reason().contains("cents"), "{unknown}");
        assert!(ProtobufCodec::parse(ORDER, &[]).unwrap_err().contains("acme/money.proto"));
    }
}

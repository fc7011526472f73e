//! Protobuf: the payload read as the message's canonical JSON mapping (proto3 JSON), encoded as the
//! message, after the Confluent message-index array.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! protox compiles the registered `.proto` and the files it imports at run time (the registry's
//! references, each under the import path it names; Google's well-known types built in), prost-reflect
//! reads the JSON into a dynamic message. The message written is the schema's only top-level message, or,
//! when it defines several, the one the row's `event_type` names by its simple or full name
//! (`OrderCreated` or `acme.orders.OrderCreated`, as the `record_name` subject preset has it); an event
//! type that names none of several is a mismatch, never a guess (issue 44: the first message was taken,
//! and consumers got the wrong message type). The message-index array before it says which, as
//! Confluent's serializers write it (`[k]`: zigzag varints of the count 1 and of `k`; `[0]` as the single
//! byte `0x00`). Nested and imported messages are fields of it. Unknown JSON fields are a mismatch (never
//! dropped); numbers are read exactly (serde_json's `float_roundtrip`).

use std::collections::HashMap;

use prost::Message as _;
use prost_reflect::{DynamicMessage, MessageDescriptor};

use super::avro::Mismatch;

/// A compiled `.proto` and the messages rows are written as.
#[derive(Debug)]
pub struct ProtobufCodec {
    /// The schema's top-level messages in the order the file defines them: the position is the message's
    /// index in Confluent's message-index array.
    messages: Vec<MessageDescriptor>,
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
        let messages: Vec<MessageDescriptor> = file.messages().collect();
        if messages.is_empty() {
            return Err("the schema defines no message".into());
        }
        Ok(ProtobufCodec { messages })
    }

    /// The message a row of `event_type` is written as, and its index among the top-level messages: the
    /// only one, else the one `event_type` names by its simple or full name.
    fn message_for(&self, event_type: &str) -> Result<(usize, &MessageDescriptor), Mismatch> {
        if let [only] = self.messages.as_slice() {
            return Ok((0, only));
        }
        let named = |m: &&MessageDescriptor| m.name() == event_type || m.full_name() == event_type;
        self.messages.iter().enumerate().find(|(_, m)| named(m)).ok_or_else(|| {
            let names: Vec<&str> = self.messages.iter().map(MessageDescriptor::full_name).collect();
            Mismatch::new(format!(
                "the event type {event_type:?} names none of the schema's messages ({}): a schema of several \
                 messages writes the one the row's event type names, by its simple or full name",
                names.join(", ")
            ))
        })
    }

    /// The full name of the message a row of `event_type` is written as.
    ///
    /// # Errors
    /// As [`ProtobufCodec::encode`] when the event type names none of several messages.
    pub fn message_name(&self, event_type: &str) -> Result<&str, Mismatch> {
        Ok(self.message_for(event_type)?.1.full_name())
    }

    /// Appends the message-index array and the message read from `text` to `out`, as the message for
    /// `event_type`.
    ///
    /// # Errors
    /// Where the JSON does not fit the message, with prost-reflect's reason; at `$` when the schema
    /// defines several messages and `event_type` names none of them.
    pub fn encode(&self, event_type: &str, text: &str, out: &mut Vec<u8>) -> Result<(), Mismatch> {
        let (index, message) = self.message_for(event_type)?;
        let mut json = serde_json::Deserializer::from_str(text);
        let mut track = serde_path_to_error::Track::new();
        let read =
            DynamicMessage::deserialize(message.clone(), serde_path_to_error::Deserializer::new(&mut json, &mut track));
        let message = match read {
            Ok(message) => message,
            Err(e) => return Err(at_path(track.path(), e.to_string())),
        };
        write_message_indexes(index, out);
        message.encode(out).expect("a Vec grows as needed");
        Ok(())
    }
}

/// Confluent's message-index array for top-level message `index`: zigzag varints of the count and of each
/// index, with `[0]` written as a count of 0 (the single byte `0x00`).
fn write_message_indexes(index: usize, out: &mut Vec<u8>) {
    if index == 0 {
        out.push(0);
        return;
    }
    for n in [1, index as u64] {
        let mut zigzag = n << 1; // non-negative: zigzag is a doubling
        while zigzag >= 0x80 {
            out.push((zigzag as u8 & 0x7f) | 0x80);
            zigzag >>= 7;
        }
        out.push(zigzag as u8);
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

    /// The message the event type names, nested and imported messages, a well-known type, from canonical
    /// JSON; the bytes read back with prost-reflect's decoder equal the JSON.
    #[test]
    fn canonical_json_becomes_the_named_message() {
        let codec = codec();
        assert_eq!(codec.message_name("OrderCreated").unwrap(), "acme.orders.OrderCreated");
        let json = r#"{"orderId": "o-1", "lines": [{"sku": "A", "qty": 2}], "total": {"currency": "CHF", "units": "12"},
            "status": "PAID", "placedAt": "2026-12-03T12:34:56.123Z", "attributes": {"k": "v"}}"#;
        let mut out = Vec::new();
        codec.encode("OrderCreated", json, &mut out).unwrap();
        assert_eq!(out[0], 0, "message index [0]");
        let read = DynamicMessage::decode(codec.messages[0].clone(), &out[1..]).unwrap();
        let back: serde_json::Value = serde_json::to_value(&read).unwrap();
        let want: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(back, want);
    }

    /// A row whose event type names another top-level message is written as that message, behind its
    /// index: `[1]` is the count 1 and the index 1, each a zigzag varint.
    #[test]
    fn the_event_type_names_the_message() {
        let codec = codec();
        assert_eq!(codec.message_name("Other").unwrap(), "acme.orders.Other");
        let mut out = Vec::new();
        codec.encode("Other", r#"{"x": "y"}"#, &mut out).unwrap();
        assert_eq!(out[..2], [2, 2], "message index [1]");
        let read = DynamicMessage::decode(codec.messages[1].clone(), &out[2..]).unwrap();
        assert_eq!(serde_json::to_value(&read).unwrap(), serde_json::json!({"x": "y"}));
        let wrong = codec.encode("Other", r#"{"orderId": "o-1"}"#, &mut Vec::new()).unwrap_err();
        assert!(wrong.reason().contains("orderId"), "{wrong}");
    }

    /// Issue 44: an event type that names none of several messages was written as the first message,
    /// and a full name (the `record_name` preset's event type) found none. The only message of a schema
    /// is written whatever the event type.
    #[test]
    fn the_event_type_picks_among_several_messages_or_is_refused() {
        let codec = codec();
        assert_eq!(codec.message_name("acme.orders.Other").unwrap(), "acme.orders.Other");
        let mut out = Vec::new();
        codec.encode("acme.orders.Other", r#"{"x": "y"}"#, &mut out).unwrap();
        assert_eq!(out[..2], [2, 2], "message index [1]");
        let refused = codec.encode("OrderPlaced", r#"{"orderId": "o-1"}"#, &mut Vec::new()).unwrap_err();
        assert_eq!(refused.path(), "$");
        assert!(refused.reason().contains("names none of the schema's messages"), "{refused}");
        assert!(refused.reason().contains("acme.orders.OrderCreated, acme.orders.Other"), "{refused}");
        let single = ProtobufCodec::parse(MONEY, &[]).unwrap();
        assert_eq!(single.message_name("MoneyMoved").unwrap(), "acme.Money");
    }

    /// Issue 44: a double was read through serde_json's fast float parser, one unit in the last place off.
    #[test]
    fn doubles_are_read_exactly() {
        let codec = ProtobufCodec::parse(r#"syntax = "proto3"; message M { double d = 1; }"#, &[]).unwrap();
        let mut out = Vec::new();
        codec.encode("M", r#"{"d": 0.9999999999999999}"#, &mut out).unwrap();
        // Message index [0], then field 1 as a fixed64 (tag 0x09) and the double's little-endian bits.
        let mut want = vec![0, 0x09];
        want.extend(0.9999999999999999f64.to_le_bytes());
        assert_eq!(out, want);
    }

    #[test]
    fn message_indexes_are_zigzag_varints() {
        for (index, bytes) in
            [(0, vec![0]), (1, vec![2, 2]), (63, vec![2, 126]), (64, vec![2, 0x80, 1]), (130, vec![2, 0x84, 2])]
        {
            let mut out = Vec::new();
            write_message_indexes(index, &mut out);
            assert_eq!(out, bytes, "[{index}]");
        }
    }

    #[test]
    fn mismatches_name_the_path() {
        for (json, path) in [
            (r#"{"lines": [{"sku": "A"}, {"qty": "many"}]}"#, "$.lines[1].qty"),
            // An unknown field is reported at its object, the reason naming it.
            (r#"{"total": {"cents": 1}}"#, "$.total"),
            (r#"{"status": "LOST"}"#, "$.status"),
        ] {
            let mismatch = codec().encode("OrderCreated", json, &mut Vec::new()).unwrap_err();
            assert_eq!(mismatch.path(), path, "{json}: {mismatch}");
        }
        let unknown = codec().encode("OrderCreated", r#"{"total": {"cents": 1}}"#, &mut Vec::new()).unwrap_err();
        assert!(unknown.reason().contains("cents"), "{unknown}");
        assert!(ProtobufCodec::parse(ORDER, &[]).unwrap_err().contains("acme/money.proto"));
    }
}

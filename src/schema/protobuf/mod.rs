//! Protobuf: the payload read as the message's canonical JSON mapping (proto3 JSON), encoded as the
//! message, after the Confluent message-index array.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! protox compiles the registered `.proto` and the files it imports at run time: the registry's
//! references, each under the import path it names; then what Confluent's serializers and registry resolve
//! without a reference ([`builtin`]: `confluent/meta.proto`, `confluent/type/decimal.proto`, Google's
//! `google/type/*.proto`); then Google's well-known types. prost-reflect reads the JSON into a dynamic
//! message, [`check`] holds the payload to the rules prost-reflect does not keep, and [`wire`] writes it.
//! tests/protobuf_corpus.rs proves the bytes against protoc's descriptors and Python's protobuf runtime.
//!
//! # Which message
//! The message written is, in this order: the message (top-level or nested, at any depth) whose full name
//! is the row's `event_type` (`acme.orders.OrderCreated`, or `acme.orders.Order.Line`, as the `record_name`
//! subject preset has it); the top-level message whose simple name it is (`OrderCreated`); the schema's
//! only top-level message. An event type that names none of several top-level messages is a mismatch,
//! never a guess (issue 44: the first message was taken, and consumers got the wrong message type). The
//! message-index array before it says which, as Confluent's serializers write it: zigzag varints of the
//! count and of each index along the nesting (`[1, 0]` is the first message nested in the second), `[0]`
//! as the single byte `0x00`.
//!
//! # The payload
//! Unknown JSON fields are a mismatch (never dropped); numbers are read exactly (serde_json's
//! `float_roundtrip`), and a number the field cannot hold is refused, never saturated or made infinite; a
//! field or map key given twice is refused; a proto2 `required` field must be present; a proto2 enum is
//! closed, so a number it does not define is refused.
//!
//! # Why not prost-reflect's encoder
//! It compares a proto3 float or double with 0.0 to leave out the default, so -0.0 was not written (protoc's
//! runtimes compare the bits), and it wrote map entries in hash order. [`wire`] writes every field in
//! number order and map entries in key order, the bytes protoc's runtimes write deterministically.

mod builtin;
mod check;
mod wire;

use std::collections::HashMap;

use prost_reflect::{DynamicMessage, MessageDescriptor};

use crate::schema::avro::Mismatch;

/// A compiled `.proto` and the messages rows are written as.
#[derive(Debug)]
pub struct ProtobufCodec {
    /// The schema's top-level messages in the order the file defines them: the position is the message's
    /// index in Confluent's message-index array.
    top_level: Vec<MessageDescriptor>,
    /// Every message of the schema, nested ones too, with its path of indexes.
    all: Vec<(Vec<usize>, MessageDescriptor)>,
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
    /// Compiles `schema`; `references` are (import path, source) of the files it imports. A reference
    /// under the path of a built-in import is the file the producer registered, and wins.
    ///
    /// # Errors
    /// protox's diagnosis, or a schema without a message.
    pub fn parse(schema: &str, references: &[(String, String)]) -> Result<Self, String> {
        let mut files: HashMap<String, String> = references.iter().cloned().collect();
        files.insert(MAIN.to_string(), schema.to_string());
        let mut resolver = protox::file::ChainFileResolver::new();
        resolver.add(Sources(files));
        resolver.add(builtin::Builtin);
        resolver.add(protox::file::GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler.open_file(MAIN).map_err(|e| e.to_string())?;
        let pool = compiler.descriptor_pool();
        let file = pool.get_file_by_name(MAIN).ok_or("the compiled schema is missing")?;
        let top_level: Vec<MessageDescriptor> = file.messages().collect();
        if top_level.is_empty() {
            return Err("the schema defines no message".into());
        }
        let mut all = Vec::new();
        for (index, message) in top_level.iter().enumerate() {
            collect(vec![index], message, &mut all);
        }
        Ok(ProtobufCodec { top_level, all })
    }

    /// The message a row of `event_type` is written as, and its path of indexes (see the module docs).
    fn message_for(&self, event_type: &str) -> Result<(&[usize], &MessageDescriptor), Mismatch> {
        let named = |m: &MessageDescriptor| m.full_name() == event_type && !m.is_map_entry();
        if let Some((indexes, message)) = self.all.iter().find(|(_, m)| named(m)) {
            return Ok((indexes, message));
        }
        if let Some((indexes, message)) = self.all.iter().find(|(i, m)| i.len() == 1 && m.name() == event_type) {
            return Ok((indexes, message));
        }
        if let [only] = self.top_level.as_slice() {
            return Ok((&[0], only));
        }
        let names: Vec<&str> = self.top_level.iter().map(MessageDescriptor::full_name).collect();
        Err(Mismatch::new(format!(
            "the event type {event_type:?} names none of the schema's messages ({}): a schema of several messages \
             writes the one the row's event type names, by its full name (a nested one too) or a top-level \
             one's simple name",
            names.join(", ")
        )))
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
    /// Where the JSON does not fit the message, with prost-reflect's reason or the rule it breaks (see the
    /// module docs); at `$` when the schema defines several messages and `event_type` names none of them.
    pub fn encode(&self, event_type: &str, text: &str, out: &mut Vec<u8>) -> Result<(), Mismatch> {
        let (indexes, descriptor) = self.message_for(event_type)?;
        let mut json = serde_json::Deserializer::from_str(text);
        let mut track = serde_path_to_error::Track::new();
        let read = DynamicMessage::deserialize(
            descriptor.clone(),
            serde_path_to_error::Deserializer::new(&mut json, &mut track),
        );
        let message = match read {
            Ok(message) => message,
            Err(e) => return Err(at_path(track.path(), e.to_string())),
        };
        check::payload(descriptor, text)?;
        write_message_indexes(indexes, out);
        wire::message(&message, out);
        Ok(())
    }
}

/// `message` and the messages nested in it, each with its path of indexes.
fn collect(indexes: Vec<usize>, message: &MessageDescriptor, all: &mut Vec<(Vec<usize>, MessageDescriptor)>) {
    all.push((indexes.clone(), message.clone()));
    // Map entries are messages the compiler nests too; Confluent's indexes count them, as protoc does.
    for (index, nested) in message.child_messages().enumerate() {
        let mut path = indexes.clone();
        path.push(index);
        collect(path, &nested, all);
    }
}

/// Confluent's message-index array for the message at `indexes`: zigzag varints of the count and of each
/// index, with `[0]` written as a count of 0 (the single byte `0x00`).
fn write_message_indexes(indexes: &[usize], out: &mut Vec<u8>) {
    if indexes == [0] {
        out.push(0);
        return;
    }
    let count = std::iter::once(indexes.len());
    for n in count.chain(indexes.iter().copied()) {
        let mut zigzag = (n as u64) << 1; // non-negative: zigzag is a doubling
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
mod tests;

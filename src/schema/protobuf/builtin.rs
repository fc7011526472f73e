//! The imports Confluent's serializers and Schema Registry resolve without a registry reference, so that a
//! registered schema may `import "google/type/money.proto"` or `import "confluent/meta.proto"` as it may
//! with Confluent's own clients.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2.
//!
//! The files are embedded from `builtin/`, each with its license header (Apache 2.0): Google's common
//! types as googleapis-common-protos 1.76.0 ships them, and Confluent's definitions as confluent-kafka
//! 2.16.1 ships them (there as generated descriptors). No crate ships these `.proto` texts (protox's own
//! resolver has only `google/protobuf/*`). tests/protobuf_corpus.py checks each embedded file against
//! those packages. Google's well-known types (`google/protobuf/*`) come from protox.

/// `google/type/<name>.proto` and its embedded text.
macro_rules! google_type {
    ($name:literal) => {
        (concat!("google/type/", $name, ".proto"), include_str!(concat!("builtin/google/type/", $name, ".proto")))
    };
}

/// The built-in imports, by import path.
const FILES: &[(&str, &str)] = &[
    ("confluent/meta.proto", include_str!("builtin/confluent/meta.proto")),
    ("confluent/type/decimal.proto", include_str!("builtin/confluent/type/decimal.proto")),
    ("confluent/type/variant.proto", include_str!("builtin/confluent/type/variant.proto")),
    ("confluent/types/decimal.proto", include_str!("builtin/confluent/types/decimal.proto")),
    google_type!("calendar_period"),
    google_type!("color"),
    google_type!("date"),
    google_type!("datetime"),
    google_type!("dayofweek"),
    google_type!("decimal"),
    google_type!("expr"),
    google_type!("fraction"),
    google_type!("interval"),
    google_type!("latlng"),
    google_type!("localized_text"),
    google_type!("money"),
    google_type!("month"),
    google_type!("phone_number"),
    google_type!("postal_address"),
    google_type!("quaternion"),
    google_type!("timeofday"),
];

/// Serves [`FILES`] to protox by import path.
pub(super) struct Builtin;

impl protox::file::FileResolver for Builtin {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        match FILES.iter().find(|(path, _)| *path == name) {
            Some((path, source)) => protox::file::File::from_source(path, source),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every embedded file compiles, with the files it imports.
    #[test]
    fn every_builtin_compiles() {
        for (path, _) in FILES {
            let mut resolver = protox::file::ChainFileResolver::new();
            resolver.add(Builtin);
            resolver.add(protox::file::GoogleFileResolver::new());
            let mut compiler = protox::Compiler::with_file_resolver(resolver);
            compiler.open_file(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    }
}

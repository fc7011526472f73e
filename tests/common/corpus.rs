//! The corpus files of the differential tests (tests/avro_corpus.rs, protobuf_corpus.rs,
//! json_schema_corpus.rs), each included with `#[path = "common/corpus.rs"] mod corpus;` so that those test
//! binaries do not build the whole service harness of `common`.

use std::path::Path;

/// Every `*.json` file of `dir`, by name, each read as a `T`; at least `at_least` of them.
pub fn read<T: serde::de::DeserializeOwned>(dir: &Path, at_least: usize) -> Vec<(String, T)> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert!(paths.len() >= at_least, "the corpus has {} schemas", paths.len());
    paths
        .iter()
        .map(|path| {
            let file = path.file_name().unwrap().to_string_lossy().to_string();
            let text = std::fs::read_to_string(path).unwrap();
            let corpus = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
            (file, corpus)
        })
        .collect()
}

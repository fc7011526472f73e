//! Text in a column's own character set, as UTF-8: what the snapshot's SQL connection receives (the server
//! converts every text column to the session's `character_set_results`, utf8mb4, [`super::SourceConn`]),
//! the stream computes from the bytes the binlog carries.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! # Invariants
//! - One mapping from a MySQL/MariaDB character set to a decoder ([`Charset::by_name`]); preflight reads the
//!   name from `information_schema`, the stream the collation id from the TABLE_MAP ([`Charset::by_collation`]),
//!   and both end there. `tests/column_types.rs` compares every byte of each single-byte character set, and
//!   every double-byte (and EUC-JP three-byte) code of the others, with the server's own conversion, and
//!   every collation id the server lists with [`collation_charset`].
//! - What [`Charset::decode`] returns is what the server returns for the same bytes. A value that is not
//!   well-formed, or holds a character the server's table reads otherwise ([`codes_read_otherwise`]), is an
//!   error (the row is undecodable), never other text: an id or aggregate id must route and key the same
//!   in both paths.
//! - A character set without a decoder is refused by preflight and makes the stream's rows undecodable,
//!   with the reason: never read as UTF-8.
//!
//! # Why these decoders
//! `encoding_rs` implements the WHATWG Encoding Standard, whose legacy encodings are the ones the servers'
//! character sets are: MySQL's `latin1` is Windows-1252 (0x80 is `€`, the five unassigned bytes map to the
//! C1 controls, as WHATWG's does), `sjis`/`cp932` are Shift_JIS (WHATWG's is Windows-31J), `euckr` is EUC-KR
//! (Windows-949), `gbk`/`gb2312` decode as GBK. No conversion table is written by hand here; where the
//! servers' tables depart from WHATWG's (measured code by code), those codes are refused, not mapped.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use encoding_rs::Encoding;
use mysql_common::collations::{Collation, CollationId};

/// How the bytes of a text column become UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charset {
    /// utf8mb4, utf8mb3, and binary strings: the bytes are UTF-8 already (checked, not converted).
    Utf8,
    /// ascii: bytes below 0x80 (UTF-8 as they are).
    Ascii,
    /// A legacy or UTF-16 character set, decoded by `encoding_rs`.
    Encoded {
        /// The server's name for it (for messages).
        name: &'static str,
        /// Its decoder.
        encoding: &'static Encoding,
    },
    /// utf32: four bytes per code point, big-endian (no WHATWG encoding).
    Utf32,
}

/// The character sets MySQL and MariaDB have that no decoder here reads.
const UNREAD: &str = "dec8, hp8, swe7, keybcs2, armscii8, geostd8, cp850, cp852 and macce";

impl Charset {
    /// The decoder of a character set named as the server names it (`CHARACTER_SET_NAME`).
    ///
    /// # Errors
    /// A character set without a decoder, with the fix.
    pub fn by_name(name: &str) -> std::result::Result<Charset, String> {
        use encoding_rs as e;
        let encoded = |name, encoding| Ok(Charset::Encoded { name, encoding });
        match name.to_ascii_lowercase().as_str() {
            "utf8mb4" | "utf8mb3" | "utf8" | "binary" => Ok(Charset::Utf8),
            "ascii" => Ok(Charset::Ascii),
            "latin1" => encoded("latin1", e::WINDOWS_1252),
            "latin2" => encoded("latin2", e::ISO_8859_2),
            "latin5" => encoded("latin5", e::WINDOWS_1254),
            "latin7" => encoded("latin7", e::ISO_8859_13),
            "tis620" => encoded("tis620", e::WINDOWS_874),
            "greek" => encoded("greek", e::ISO_8859_7),
            "hebrew" => encoded("hebrew", e::ISO_8859_8),
            "cp1250" => encoded("cp1250", e::WINDOWS_1250),
            "cp1251" => encoded("cp1251", e::WINDOWS_1251),
            "cp1256" => encoded("cp1256", e::WINDOWS_1256),
            "cp1257" => encoded("cp1257", e::WINDOWS_1257),
            "cp866" => encoded("cp866", e::IBM866),
            "koi8r" => encoded("koi8r", e::KOI8_R),
            "koi8u" => encoded("koi8u", e::KOI8_U),
            "macroman" => encoded("macroman", e::MACINTOSH),
            "gbk" => encoded("gbk", e::GBK),
            "gb2312" => encoded("gb2312", e::GBK),
            "gb18030" => encoded("gb18030", e::GB18030),
            "big5" => encoded("big5", e::BIG5),
            "sjis" => encoded("sjis", e::SHIFT_JIS),
            "cp932" => encoded("cp932", e::SHIFT_JIS),
            "ujis" => encoded("ujis", e::EUC_JP),
            "eucjpms" => encoded("eucjpms", e::EUC_JP),
            "euckr" => encoded("euckr", e::EUC_KR),
            "ucs2" => encoded("ucs2", e::UTF_16BE),
            "utf16" => encoded("utf16", e::UTF_16BE),
            "utf16le" => encoded("utf16le", e::UTF_16LE),
            "utf32" => Ok(Charset::Utf32),
            other => Err(format!(
                "character set {other}: the connector has no decoder for it (none for {UNREAD}); convert the \
                 column to utf8mb4"
            )),
        }
    }

    /// The decoder of the character set of a collation id (as a TABLE_MAP's optional metadata gives it).
    ///
    /// # Errors
    /// An unknown collation id, or a character set without a decoder.
    pub fn by_collation(id: u16) -> std::result::Result<Charset, String> {
        match collation_charset(id) {
            Some(name) => Charset::by_name(&name),
            None => Err(format!("collation id {id} is not one the connector knows the character set of")),
        }
    }

    /// Whether the bytes are UTF-8 already.
    pub fn is_utf8(&self) -> bool {
        *self == Charset::Utf8
    }

    /// The text of a value's bytes.
    ///
    /// # Errors
    /// Bytes that are not well-formed in this character set, saying which.
    pub fn decode<'a>(&self, bytes: &'a [u8]) -> std::result::Result<Cow<'a, str>, String> {
        let decoded = match self {
            Charset::Utf8 => std::str::from_utf8(bytes).ok().map(Cow::Borrowed),
            Charset::Ascii => bytes.is_ascii().then(|| std::str::from_utf8(bytes).ok().map(Cow::Borrowed)).flatten(),
            Charset::Encoded { name, encoding } => {
                let text = encoding.decode_without_bom_handling_and_without_replacement(bytes);
                if let Some(c) = text.as_deref().and_then(|t| t.chars().find(|c| read_otherwise(name).contains(c))) {
                    return Err(format!(
                        "its character {c:?} (U+{:04X}) is one the server's {name} table reads otherwise",
                        u32::from(c)
                    ));
                }
                text
            }
            Charset::Utf32 => {
                let chars = bytes.chunks(4).map(|c| match <[u8; 4]>::try_from(c) {
                    Ok(c) => char::from_u32(u32::from_be_bytes(c)),
                    Err(_) => None,
                });
                chars.collect::<Option<String>>().map(Cow::Owned)
            }
        };
        decoded.ok_or_else(|| format!("its bytes are not valid {}", self.name()))
    }

    /// The server's name of the character set.
    pub fn name(&self) -> &'static str {
        match self {
            Charset::Utf8 => "UTF-8",
            Charset::Ascii => "ascii",
            Charset::Encoded { name, .. } => name,
            Charset::Utf32 => "utf32",
        }
    }
}

/// The character set of a collation id, as MySQL and MariaDB number them; `None` for an unknown id.
pub fn collation_charset(id: u16) -> Option<String> {
    const UNICODE: [&str; 5] = ["utf8mb3", "utf8mb4", "ucs2", "utf16", "utf32"];
    // MariaDB 10.10+'s UCA 14.0.0 collations are numbered `1ccc tttt tPST` in binary, `c` the character set
    // (utf8mb3 0, utf8mb4 1, ucs2 2, utf16 3, utf32 4).
    if (2048..=4095).contains(&id) {
        return UNICODE.get(usize::from((id >> 8) & 0x7)).map(|c| c.to_string());
    }
    // MariaDB's NO PAD collations are numbered 1024 + the PAD SPACE collation of the same character set.
    let id = if (1024..2048).contains(&id) { id - 1024 } else { id };
    // MariaDB's Unicode collations compatible with MySQL 5.6.1 (`*_croatian_mysql561_ci`, `*_myanmar_ci`, …).
    let mariadb = match id {
        576..=607 => Some(UNICODE[0]),
        608..=639 => Some(UNICODE[1]),
        640..=671 => Some(UNICODE[2]),
        672..=703 => Some(UNICODE[3]),
        736..=767 => Some(UNICODE[4]),
        _ => None,
    };
    if let Some(charset) = mariadb {
        return Some(charset.to_string());
    }
    // Below 576 MySQL and MariaDB agree where both have an id; mysql_common lists MySQL's.
    match CollationId::from(id) {
        CollationId::UNKNOWN_COLLATION_ID => None,
        known => Some(Collation::from(known).charset().to_string()),
    }
}

/// The characters that [`Charset::decode`] refuses in character set `name`: what the WHATWG decoder gives
/// for the codes where the server's own table gives another character, or none (`?`). Empty for the sets
/// where every code agrees (latin1, latin2, latin7, koi8r, macroman, euckr, the Unicode ones).
fn read_otherwise(name: &'static str) -> &'static HashSet<char> {
    static SETS: OnceLock<HashMap<&'static str, HashSet<char>>> = OnceLock::new();
    static NONE: OnceLock<HashSet<char>> = OnceLock::new();
    let sets = SETS.get_or_init(|| {
        let mut sets = HashMap::new();
        for name in ["big5", "cp1250", "cp1251", "cp1256", "cp1257", "cp866", "cp932", "eucjpms", "gb2312", "gbk"]
            .into_iter()
            .chain(["greek", "hebrew", "koi8u", "latin5", "sjis", "tis620", "ujis"])
        {
            let Ok(Charset::Encoded { encoding, .. }) = Charset::by_name(name) else { continue };
            let mut chars = HashSet::new();
            for &(first, last) in codes_read_otherwise(name) {
                for code in first..=last {
                    let bytes = code.to_be_bytes();
                    let start = bytes.iter().position(|b| *b != 0).unwrap_or(3);
                    let text = encoding.decode_without_bom_handling_and_without_replacement(&bytes[start..]);
                    // One code, one character: a code that decodes to several is no character of the set.
                    if let Some(mut one) = text.as_deref().map(str::chars) {
                        if let (Some(c), None) = (one.next(), one.next()) {
                            chars.insert(c);
                        }
                    }
                }
            }
            sets.insert(name, chars);
        }
        sets
    });
    sets.get(name).unwrap_or_else(|| NONE.get_or_init(HashSet::new))
}

/// The codes (byte sequences as big-endian numbers, inclusive ranges) where the WHATWG decoder and the
/// server's conversion to utf8mb4 disagree, measured for every byte of each single-byte character set and
/// every double-byte (and EUC-JP three-byte) code of the others against MariaDB 10.11 by
/// `tests/column_types.rs` (`charsets_decode_as_the_server_converts`), which fails when this list misses
/// one. This says where the decoder is not to be trusted, never what the character is: the server's
/// ETEN extensions of big5 (kana and Cyrillic in rows C6-C8), its JIS X 0208 row 1 (`\` for 0x815F where
/// Windows-31J has `＼`), the C1 controls of latin5 and tis620, and the codes it has no character for.
fn codes_read_otherwise(name: &str) -> &'static [(u32, u32)] {
    match name {
        "big5" => &[
            (0x8740, 0xA0FE),
            (0xA145, 0xA145),
            (0xA14E, 0xA14E),
            (0xA15A, 0xA15A),
            (0xA1C2, 0xA1C3),
            (0xA1C5, 0xA1C5),
            (0xA1E3, 0xA1E3),
            (0xA1F2, 0xA1F3),
            (0xA1FE, 0xA242),
            (0xA244, 0xA244),
            (0xA246, 0xA247),
            (0xA2CC, 0xA2CC),
            (0xA2CE, 0xA2CE),
            (0xA3C0, 0xA3E1),
            (0xC6A1, 0xC8FE),
            (0xF9DD, 0xFEFE),
        ],
        "cp1250" => &[(0x81, 0x81), (0x83, 0x83), (0x88, 0x88), (0x90, 0x90), (0x98, 0x98)],
        "cp1251" => &[(0x98, 0x98)],
        "cp1256" => &[
            (0x8A, 0x8A),
            (0x8F, 0x8F),
            (0x98, 0x98),
            (0x9A, 0x9A),
            (0x9F, 0x9F),
            (0xAA, 0xAA),
            (0xC0, 0xC0),
            (0xFF, 0xFF),
        ],
        "cp1257" => &[
            (0x81, 0x81),
            (0x83, 0x83),
            (0x88, 0x88),
            (0x8A, 0x8A),
            (0x8C, 0x8C),
            (0x90, 0x90),
            (0x98, 0x98),
            (0x9A, 0x9A),
            (0x9C, 0x9C),
            (0x9F, 0x9F),
        ],
        "cp866" => &[(0xFC, 0xFD)],
        "cp932" => &[(0x80, 0x80)],
        "eucjpms" => &[(0xF9A1, 0xFCFE), (0x8FA2C3, 0x8FA2C3)],
        "gb2312" => &[
            (0x8140, 0xA1A0),
            (0xA1A4, 0xA1A4),
            (0xA1AA, 0xA1AA),
            (0xA240, 0xA2B0),
            (0xA2E3, 0xA2E4),
            (0xA2EF, 0xA2F0),
            (0xA2FD, 0xA3A0),
            (0xA440, 0xA4A0),
            (0xA4F4, 0xA5A0),
            (0xA5F7, 0xA6A0),
            (0xA6B9, 0xA6C0),
            (0xA6D9, 0xA7A0),
            (0xA7C2, 0xA7D0),
            (0xA7F2, 0xA8A0),
            (0xA8BB, 0xA8C4),
            (0xA8EA, 0xA9A3),
            (0xA9F0, 0xB0A0),
            (0xB140, 0xB1A0),
            (0xB240, 0xB2A0),
            (0xB340, 0xB3A0),
            (0xB440, 0xB4A0),
            (0xB540, 0xB5A0),
            (0xB640, 0xB6A0),
            (0xB740, 0xB7A0),
            (0xB840, 0xB8A0),
            (0xB940, 0xB9A0),
            (0xBA40, 0xBAA0),
            (0xBB40, 0xBBA0),
            (0xBC40, 0xBCA0),
            (0xBD40, 0xBDA0),
            (0xBE40, 0xBEA0),
            (0xBF40, 0xBFA0),
            (0xC040, 0xC0A0),
            (0xC140, 0xC1A0),
            (0xC240, 0xC2A0),
            (0xC340, 0xC3A0),
            (0xC440, 0xC4A0),
            (0xC540, 0xC5A0),
            (0xC640, 0xC6A0),
            (0xC740, 0xC7A0),
            (0xC840, 0xC8A0),
            (0xC940, 0xC9A0),
            (0xCA40, 0xCAA0),
            (0xCB40, 0xCBA0),
            (0xCC40, 0xCCA0),
            (0xCD40, 0xCDA0),
            (0xCE40, 0xCEA0),
            (0xCF40, 0xCFA0),
            (0xD040, 0xD0A0),
            (0xD140, 0xD1A0),
            (0xD240, 0xD2A0),
            (0xD340, 0xD3A0),
            (0xD440, 0xD4A0),
            (0xD540, 0xD5A0),
            (0xD640, 0xD6A0),
            (0xD740, 0xD7A0),
            (0xD7FA, 0xD8A0),
            (0xD940, 0xD9A0),
            (0xDA40, 0xDAA0),
            (0xDB40, 0xDBA0),
            (0xDC40, 0xDCA0),
            (0xDD40, 0xDDA0),
            (0xDE40, 0xDEA0),
            (0xDF40, 0xDFA0),
            (0xE040, 0xE0A0),
            (0xE140, 0xE1A0),
            (0xE240, 0xE2A0),
            (0xE340, 0xE3A0),
            (0xE440, 0xE4A0),
            (0xE540, 0xE5A0),
            (0xE640, 0xE6A0),
            (0xE740, 0xE7A0),
            (0xE840, 0xE8A0),
            (0xE940, 0xE9A0),
            (0xEA40, 0xEAA0),
            (0xEB40, 0xEBA0),
            (0xEC40, 0xECA0),
            (0xED40, 0xEDA0),
            (0xEE40, 0xEEA0),
            (0xEF40, 0xEFA0),
            (0xF040, 0xF0A0),
            (0xF140, 0xF1A0),
            (0xF240, 0xF2A0),
            (0xF340, 0xF3A0),
            (0xF440, 0xF4A0),
            (0xF540, 0xF5A0),
            (0xF640, 0xF6A0),
            (0xF740, 0xF7A0),
            (0xF840, 0xFEFE),
        ],
        "gbk" => &[
            (0xA140, 0xA1A0),
            (0xA240, 0xA2A0),
            (0xA2AB, 0xA2B0),
            (0xA2E3, 0xA2E4),
            (0xA2EF, 0xA2F0),
            (0xA2FD, 0xA3A0),
            (0xA440, 0xA4A0),
            (0xA4F4, 0xA5A0),
            (0xA5F7, 0xA6A0),
            (0xA6B9, 0xA6C0),
            (0xA6D9, 0xA6DF),
            (0xA6EC, 0xA6ED),
            (0xA6F3, 0xA6F3),
            (0xA6F6, 0xA7A0),
            (0xA7C2, 0xA7D0),
            (0xA7F2, 0xA7FE),
            (0xA896, 0xA8A0),
            (0xA8BC, 0xA8BC),
            (0xA8BF, 0xA8BF),
            (0xA8C1, 0xA8C4),
            (0xA8EA, 0xA8FE),
            (0xA958, 0xA958),
            (0xA95B, 0xA95B),
            (0xA95D, 0xA95F),
            (0xA989, 0xA995),
            (0xA997, 0xA9A3),
            (0xA9F0, 0xA9FE),
            (0xAAA1, 0xAAFE),
            (0xABA1, 0xABFE),
            (0xACA1, 0xACFE),
            (0xADA1, 0xADFE),
            (0xAEA1, 0xAEFE),
            (0xAFA1, 0xAFFE),
            (0xD7FA, 0xD7FE),
            (0xF8A1, 0xF8FE),
            (0xF9A1, 0xF9FE),
            (0xFAA1, 0xFAFE),
            (0xFBA1, 0xFBFE),
            (0xFCA1, 0xFCFE),
            (0xFDA1, 0xFDFE),
            (0xFE50, 0xFEFE),
        ],
        "greek" => &[(0xA1, 0xA2), (0xA4, 0xA5), (0xAA, 0xAA)],
        "hebrew" => &[(0xAF, 0xAF)],
        "koi8u" => &[(0x95, 0x95), (0xAE, 0xAE), (0xBE, 0xBE)],
        "latin5" => &[(0x80, 0x80), (0x82, 0x8C), (0x91, 0x9C), (0x9F, 0x9F)],
        "sjis" => &[
            (0x80, 0x80),
            (0x815F, 0x8161),
            (0x817C, 0x817C),
            (0x8191, 0x8192),
            (0x81CA, 0x81CA),
            (0x8740, 0x879C),
            (0xED40, 0xFC4B),
        ],
        "tis620" => &[(0x80, 0x80), (0x85, 0x85), (0x91, 0x97), (0xA0, 0xA0)],
        "ujis" => &[
            (0xA1C0, 0xA1C2),
            (0xA1DD, 0xA1DD),
            (0xA1F1, 0xA1F2),
            (0xA2CC, 0xA2CC),
            (0xADA1, 0xADFC),
            (0xF9A1, 0xFCFE),
            (0x8FA2B7, 0x8FA2B7),
        ],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row per rule: the character set, bytes in it, the text a `SELECT` returns for them (from the
    /// server's own conversion, see `tests/column_types.rs`).
    #[test]
    fn each_charset_decodes_as_the_server_converts() {
        let cases: [(&str, &[u8], &str); 12] = [
            ("latin1", b"Z\xfcrich \x80 \x81", "Zürich € \u{81}"),
            ("latin1", b"\xc3\xa9", "Ã©"),
            ("cp1250", b"\x8a\xe8", "Šč"),
            ("koi8r", b"\xf0\xd2\xc9\xd7\xc5\xd4", "Привет"),
            ("gbk", b"\xd6\xd0\xce\xc4", "中文"),
            ("gb18030", b"\x81\x30\x81\x30", "\u{80}"),
            ("big5", b"\xa4\xa4\xa4\xe5", "中文"),
            ("sjis", b"\x93\xfa\x96\x7b", "日本"),
            ("ujis", b"\xc6\xfc\xcb\xdc", "日本"),
            ("euckr", b"\xc7\xd1\xb1\xdb", "한글"),
            ("utf16", b"\x00A\xd8\x3d\xde\x80", "A🚀"),
            ("utf32", b"\x00\x00\x00A\x00\x01\xf6\x80", "A🚀"),
        ];
        for (name, bytes, text) in cases {
            let charset = Charset::by_name(name).unwrap();
            assert_eq!(charset.decode(bytes).unwrap(), text, "{name}");
        }
    }

    #[test]
    fn malformed_bytes_are_an_error_not_a_replacement() {
        for (name, bytes) in [("gbk", &b"\xd6"[..]), ("big5", b"\xa4"), ("utf8mb4", b"\xc3("), ("utf32", b"\0\0\0")] {
            let err = Charset::by_name(name).unwrap().decode(bytes).unwrap_err();
            assert!(err.contains("not valid"), "{name}: {err}");
        }
    }

    #[test]
    fn charsets_without_a_decoder_are_refused_with_the_fix() {
        for name in ["dec8", "swe7", "armscii8", "cp850", "macce"] {
            let err = Charset::by_name(name).unwrap_err();
            assert!(err.contains(&format!("character set {name}")) && err.contains("utf8mb4"), "{err}");
        }
    }

    /// Collation ids as MySQL and MariaDB number them, including MariaDB's NO PAD and UCA 14.0.0 ranges.
    #[test]
    fn collation_ids_name_their_charset() {
        let cases: [(u16, Option<&str>); 10] = [
            (8, Some("latin1")),
            (45, Some("utf8mb4")),
            (28, Some("gbk")),
            (1, Some("big5")),
            (255, Some("utf8mb4")),
            (63, Some("binary")),
            (1071, Some("latin1")),
            (608, Some("utf8mb4")),
            (2048 + (1 << 8), Some("utf8mb4")),
            (900, None),
        ];
        for (id, charset) in cases {
            assert_eq!(collation_charset(id).as_deref(), charset, "collation {id}");
        }
    }
}

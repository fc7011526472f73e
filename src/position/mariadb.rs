//! MariaDB GTID positions.
//!
//! Floor 0, the ground floor (docs/ARCHITECTURE.md): imports nothing of ours but other ground-floor modules.
//!
//! A MariaDB GTID is `domain-server-seq`: the replication domain, the `server_id` that
//! committed the transaction, and a sequence number. Within a domain, the binlog is one
//! ordered stream, so a position is just the last GTID seen in each domain. That is what
//! `@@gtid_binlog_pos`, `@@gtid_current_pos`, `BINLOG_GTID_POS(file, pos)` and the
//! `@slave_connect_state` a replica sends all hold: comma-separated `d-s-n`, one per domain.
//! (`@@gtid_binlog_state` is different: one entry per domain *and server*, and is refused
//! here because it lists a domain twice.)
//!
//! # Invariants
//!
//! * [`GtidPos`] holds at most one GTID per domain and prints domains in ascending order, so
//!   `==` is equality of positions and `parse(display(x)) == x`.
//! * [`GtidPos::advance`] records the latest GTID seen for its domain, even if its sequence
//!   number is lower: the binlog order is the truth, and without `gtid_strict_mode` sequence
//!   numbers may go backwards. Keeping the larger one would describe a point that never
//!   existed in the binlog.
//!
//! # Ordering
//!
//! Positions compare per domain by sequence number, a domain missing on one side counting as
//! sequence 0. That is only a partial order, and [`GtidPos::compare`] says `None` when it has
//! no answer:
//!
//! * one position is ahead in one domain and behind in another, or
//! * both hold the same non-zero sequence number in a domain from different servers: two
//!   different transactions carry the same number, i.e. the histories diverged (typically a
//!   failover without `gtid_strict_mode`).
//!
//! `0-1-0` and the empty position include no transaction, so they compare `Equal` although
//! they are not `==`.
//!
//! # Why not a GTID set
//!
//! MariaDB does not track gaps: a replica that has applied `0-1-42` claims `0-1-1` to
//! `0-1-41`. Modelling a position as a set would invent a precision the server does not have.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use super::{parse_decimal, PositionParseError};

/// One MariaDB transaction identifier: `domain-server-seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MariaGtid {
    /// Replication domain (`gtid_domain_id`); each domain is an independent stream.
    pub domain_id: u32,
    /// `server_id` of the server that committed the transaction.
    pub server_id: u32,
    /// Sequence number within the domain.
    pub seq_no: u64,
}

impl FromStr for MariaGtid {
    type Err = PositionParseError;

    /// Parses `domain-server-seq`, three decimal numbers, with surrounding whitespace
    /// allowed and none inside.
    ///
    /// # Errors
    ///
    /// [`PositionParseError::Syntax`] for another shape; [`PositionParseError::Number`] for a
    /// number that is not plain decimal or is out of range (`u32` ids, `u64` sequence).
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let text = input.trim();
        let mut parts = text.split('-');
        let (Some(domain), Some(server), Some(seq), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(PositionParseError::Syntax {
                what: "MariaDB GTID",
                input: input.to_owned(),
                expected: "`domain-server-seq`, e.g. `0-1-42`",
            });
        };
        let id = |text, what| parse_decimal(text, what, 0, u32::MAX.into()).map(|n| n as u32);
        Ok(MariaGtid {
            domain_id: id(domain, "domain id")?,
            server_id: id(server, "server id")?,
            seq_no: parse_decimal(seq, "sequence number", 0, u64::MAX)?,
        })
    }
}

impl fmt::Display for MariaGtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.domain_id, self.server_id, self.seq_no)
    }
}

/// A MariaDB GTID position: the last GTID seen in each replication domain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GtidPos {
    /// Domain id to (server id, sequence number) of the last GTID seen in it.
    domains: BTreeMap<u32, (u32, u64)>,
}

impl GtidPos {
    /// The empty position: nothing seen in any domain.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when no domain has a GTID.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// The last GTID seen in `domain_id`, if any.
    pub fn get(&self, domain_id: u32) -> Option<MariaGtid> {
        self.domains.get(&domain_id).map(|&(server_id, seq_no)| MariaGtid { domain_id, server_id, seq_no })
    }

    /// The GTID of every domain, domains ascending.
    pub fn iter(&self) -> impl Iterator<Item = MariaGtid> + '_ {
        self.domains.iter().map(|(&domain_id, &(server_id, seq_no))| MariaGtid { domain_id, server_id, seq_no })
    }

    /// Records `gtid` as the last GTID of its domain, replacing whatever was there.
    pub fn advance(&mut self, gtid: MariaGtid) {
        self.domains.insert(gtid.domain_id, (gtid.server_id, gtid.seq_no));
    }

    /// True when the position has seen `gtid`: this position has its domain, at the same or
    /// a higher sequence number. The server id is not compared; MariaDB identifies a
    /// transaction's place in a domain by its sequence number.
    pub fn contains(&self, gtid: &MariaGtid) -> bool {
        self.domains.get(&gtid.domain_id).is_some_and(|&(_, seq_no)| gtid.seq_no <= seq_no)
    }

    /// How `self` relates to `other`, domain by domain: `Less` when behind or equal in every
    /// domain and behind in one, `Greater` the other way round, `Equal` when level
    /// everywhere, `None` when incomparable (see the module documentation). A domain missing
    /// on one side counts as sequence number 0.
    pub fn compare(&self, other: &GtidPos) -> Option<Ordering> {
        let (mut behind, mut ahead) = (false, false);
        let domains = self.domains.keys().chain(other.domains.keys());
        for domain in domains {
            let ours = self.domains.get(domain);
            let theirs = other.domains.get(domain);
            let seq = |entry: Option<&(u32, u64)>| entry.map_or(0, |&(_, seq_no)| seq_no);
            match seq(ours).cmp(&seq(theirs)) {
                Ordering::Less => behind = true,
                Ordering::Greater => ahead = true,
                Ordering::Equal => {
                    if let (Some(&(a, n)), Some(&(b, _))) = (ours, theirs) {
                        if a != b && n != 0 {
                            return None;
                        }
                    }
                }
            }
        }
        match (behind, ahead) {
            (false, false) => Some(Ordering::Equal),
            (true, false) => Some(Ordering::Less),
            (false, true) => Some(Ordering::Greater),
            (true, true) => None,
        }
    }
}

impl FromStr for GtidPos {
    type Err = PositionParseError;

    /// Parses comma-separated `domain-server-seq` GTIDs with any whitespace around them, in
    /// any domain order. Empty or all-whitespace text is the empty position.
    ///
    /// # Errors
    ///
    /// A malformed GTID, an empty element (`0-1-1,,1-1-1` or a trailing comma), or
    /// [`PositionParseError::DuplicateDomain`] when a domain appears twice, as it does in
    /// `@@gtid_binlog_state`; keeping either entry would pick a resume point by guessing.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let mut pos = GtidPos::new();
        if input.trim().is_empty() {
            return Ok(pos);
        }
        for element in input.split(',') {
            if element.trim().is_empty() {
                return Err(PositionParseError::Syntax {
                    what: "MariaDB GTID position",
                    input: input.to_owned(),
                    expected: "comma-separated `domain-server-seq` with nothing empty between commas",
                });
            }
            let gtid: MariaGtid = element.parse()?;
            if let Some(first) = pos.get(gtid.domain_id) {
                return Err(PositionParseError::DuplicateDomain {
                    domain: gtid.domain_id,
                    first: first.to_string(),
                    second: gtid.to_string(),
                });
            }
            pos.advance(gtid);
        }
        Ok(pos)
    }
}

impl fmt::Display for GtidPos {
    /// Canonical form: `d-s-n` joined by `,`, domains ascending; the empty position prints
    /// as the empty string, as MariaDB prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, gtid) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{gtid}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pos(text: &str) -> GtidPos {
        text.parse().unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    fn gtid(text: &str) -> MariaGtid {
        text.parse().unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    #[test]
    fn gtids_parse_and_print() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("0-1-42", Ok("0-1-42")),
            (" 1-10-292197\n", Ok("1-10-292197")),
            ("4294967295-4294967295-18446744073709551615", Ok("4294967295-4294967295-18446744073709551615")),
            ("0-1", Err("expected `domain-server-seq`")),
            ("0-1-2-3", Err("expected `domain-server-seq`")),
            ("-1-2", Err(r#"invalid domain id """#)),
            ("0-1--2", Err("expected `domain-server-seq`")),
            ("4294967296-1-1", Err("invalid domain id")),
            ("0-4294967296-1", Err("invalid server id")),
            ("0-1-18446744073709551616", Err("invalid sequence number")),
            ("0-1-01", Err("leading zeros")),
            ("0 -1-1", Err(r#"invalid domain id "0 ""#)),
            ("a-1-1", Err("invalid domain id")),
        ];
        for &(input, expected) in cases {
            match (input.parse::<MariaGtid>(), expected) {
                (Ok(g), Ok(text)) => assert_eq!(g.to_string(), text),
                (Err(e), Err(needle)) => assert!(e.to_string().contains(needle), "{input}: {e}"),
                (got, want) => panic!("{input:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// Shapes of `@@gtid_binlog_pos` / `@@gtid_current_pos` and their canonical form.
    #[test]
    fn positions_parse_server_output_into_canonical_form() {
        let cases: &[(&str, &str)] = &[
            ("", ""),
            (" \n", ""),
            ("0-1-42", "0-1-42"),
            ("0-10-292196", "0-10-292196"),
            ("1-10-12,0-10-292196", "0-10-292196,1-10-12"),
            (" 0-1-1 ,\n 1-1-5 ", "0-1-1,1-1-5"),
            ("0-1-0", "0-1-0"),
        ];
        for &(input, canonical) in cases {
            let parsed = pos(input);
            assert_eq!(parsed.to_string(), canonical, "{input:?}");
            assert_eq!(pos(canonical), parsed);
        }
    }

    #[test]
    fn positions_reject_malformed_text_with_a_diagnosis() {
        let cases: &[(&str, &str)] = &[
            ("0-1-1,0-2-5", "lists domain 0 twice (0-1-1 and 0-2-5)"),
            ("0-1-1,", "nothing empty between commas"),
            (",0-1-1", "nothing empty between commas"),
            ("0-1-1,,1-1-1", "nothing empty between commas"),
            ("0-1-1;1-1-1", "expected `domain-server-seq`"),
            ("0-1-1 1-1-1", "expected `domain-server-seq`"),
            ("0-1-1, 0-1-x", r#"invalid sequence number "x""#),
            ("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5", "expected `domain-server-seq`"),
        ];
        for &(input, needle) in cases {
            let error = input.parse::<GtidPos>().expect_err(input).to_string();
            assert!(error.contains(needle), "{input:?}: {error}");
        }
    }

    #[test]
    fn advance_records_the_latest_gtid_of_its_domain() {
        let cases: &[(&str, &str, &str)] = &[
            ("", "0-1-1", "0-1-1"),
            ("0-1-1", "0-1-2", "0-1-2"),
            ("0-1-5", "0-2-6", "0-2-6"),
            ("0-1-5", "1-1-1", "0-1-5,1-1-1"),
            // Binlog order wins over sequence order (no gtid_strict_mode).
            ("0-1-5", "0-1-3", "0-1-3"),
        ];
        for &(before, g, after) in cases {
            let mut p = pos(before);
            p.advance(gtid(g));
            assert_eq!(p.to_string(), after, "{before} + {g}");
            assert_eq!(p.get(gtid(g).domain_id), Some(gtid(g)));
        }
    }

    /// Guards the boundary: the position's own GTID is contained, the next one is not.
    #[test]
    fn contains_compares_sequence_numbers_within_a_domain() {
        let p = pos("0-1-42,1-2-7");
        let cases: &[(&str, bool)] = &[
            ("0-1-41", true),
            ("0-1-42", true),
            ("0-1-43", false),
            ("0-9-42", true),
            ("1-2-7", true),
            ("1-2-8", false),
            ("2-1-1", false),
            ("2-1-0", false),
        ];
        for &(g, expected) in cases {
            assert_eq!(p.contains(&gtid(g)), expected, "{g}");
        }
        assert_eq!(p.get(5), None);
    }

    #[test]
    fn compare_is_per_domain_and_refuses_to_guess() {
        use Ordering::*;
        let cases: &[(&str, &str, Option<Ordering>)] = &[
            ("", "", Some(Equal)),
            ("0-1-5", "0-1-5", Some(Equal)),
            ("0-1-4", "0-1-5", Some(Less)),
            ("0-1-6", "0-1-5", Some(Greater)),
            ("0-1-5", "0-2-6", Some(Less)),
            ("0-1-5", "0-1-5,1-1-1", Some(Less)),
            ("", "0-1-1", Some(Less)),
            ("0-1-5,1-1-3", "0-1-6,1-1-3", Some(Less)),
            // Ahead in one domain, behind in another.
            ("0-1-6,1-1-2", "0-1-5,1-1-3", None),
            ("0-1-5", "1-1-1", None),
            // Same sequence number from two servers: diverged histories.
            ("0-1-5", "0-2-5", None),
            // Sequence 0 holds nothing, whoever wrote it.
            ("0-1-0", "", Some(Equal)),
            ("0-1-0", "0-2-0", Some(Equal)),
        ];
        for &(a, b, expected) in cases {
            assert_eq!(pos(a).compare(&pos(b)), expected, "{a} vs {b}");
            assert_eq!(pos(b).compare(&pos(a)), expected.map(Ordering::reverse), "{b} vs {a}");
        }
    }

    // ---- properties ----

    fn maria_gtid() -> impl Strategy<Value = MariaGtid> {
        (0u32..4, 1u32..4, 0u64..12).prop_map(|(domain_id, server_id, seq_no)| MariaGtid {
            domain_id,
            server_id,
            seq_no,
        })
    }

    fn gtid_pos() -> impl Strategy<Value = GtidPos> {
        prop::collection::vec(maria_gtid(), 0..8).prop_map(|gtids| {
            let mut p = GtidPos::new();
            gtids.into_iter().for_each(|g| p.advance(g));
            p
        })
    }

    proptest! {
        #[test]
        fn display_then_parse_is_identity(p in gtid_pos(), g in maria_gtid()) {
            prop_assert_eq!(pos(&p.to_string()), p.clone());
            let json = serde_json::to_string(&p).unwrap();
            prop_assert_eq!(serde_json::from_str::<GtidPos>(&json).unwrap(), p);
            prop_assert_eq!(gtid(&g.to_string()), g);
        }

        #[test]
        fn advance_then_contains(mut p in gtid_pos(), g in maria_gtid()) {
            p.advance(g);
            prop_assert!(p.contains(&g));
            prop_assert_eq!(p.get(g.domain_id), Some(g));
            let next = MariaGtid { seq_no: g.seq_no + 1, ..g };
            prop_assert!(!p.contains(&next));
        }

        #[test]
        fn advancing_forward_never_moves_back(
            mut p in gtid_pos(),
            g in maria_gtid(),
            step in 1u64..5,
        ) {
            let before = p.clone();
            let current = before.get(g.domain_id).map_or(0, |c| c.seq_no);
            p.advance(MariaGtid { seq_no: current + step, ..g });
            prop_assert_eq!(p.compare(&before), Some(Ordering::Greater));
            prop_assert_eq!(before.compare(&p), Some(Ordering::Less));
        }

        #[test]
        fn compare_is_antisymmetric_and_agrees_with_contains(a in gtid_pos(), b in gtid_pos()) {
            let order = a.compare(&b);
            prop_assert_eq!(b.compare(&a), order.map(Ordering::reverse));
            prop_assert_eq!(a.compare(&a), Some(Ordering::Equal));
            if a == b {
                prop_assert_eq!(order, Some(Ordering::Equal));
            }
            // Behind or level means every transaction we have seen, they have seen too.
            if matches!(order, Some(Ordering::Less | Ordering::Equal)) {
                for g in a.iter().filter(|g| g.seq_no > 0) {
                    prop_assert!(b.contains(&g), "{} vs {}: {}", a, b, g);
                }
            }
        }
    }
}

//! Unit and property tests for MySQL GTID sets.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

const U1: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
const U2: &str = "4c2ad77f-697e-11e3-b2e2-c80aa9429562";

fn set(text: &str) -> GtidSet {
    text.parse().unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
}

fn gtid(text: &str) -> Gtid {
    text.parse().unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
}

/// Checks the storage invariants through the public iterator.
fn assert_canonical(set: &GtidSet) {
    for (uuid, tag, ranges) in set.iter() {
        assert!(!ranges.is_empty(), "{uuid} {tag:?} has no ranges");
        for r in ranges {
            assert!(1 <= r.start && r.start < r.end && r.end <= MAX_GNO + 1, "{r:?}");
        }
        for pair in ranges.windows(2) {
            assert!(pair[0].end < pair[1].start, "{pair:?} touch or overlap");
        }
    }
}

#[test]
fn uuids_parse_case_insensitively_and_print_lower_case() {
    let cases: &[(&str, Option<&str>)] = &[
        (U1, Some(U1)),
        ("3E11FA47-71CA-11E1-9E33-C80AA9429562", Some(U1)),
        ("00000000-0000-0000-0000-000000000000", Some("00000000-0000-0000-0000-000000000000")),
        ("3e11fa47-71ca-11e1-9e33-c80aa942956", None),
        ("3e11fa47-71ca-11e1-9e33-c80aa94295620", None),
        ("3e11fa4771ca11e19e33c80aa9429562", None),
        ("3e11fa47-71ca-11e1-9e33_c80aa9429562", None),
        ("3e11fa47-71ca-11e1-9e33-c80aa942956g", None),
        ("{3e11fa47-71ca-11e1-9e33-c80aa94295}", None),
        ("", None),
    ];
    for &(input, expected) in cases {
        let parsed = input.parse::<Uuid>().map(|u| u.to_string());
        assert_eq!(parsed.as_deref().ok(), expected, "{input:?}");
    }
    let uuid: Uuid = U1.parse().unwrap();
    assert_eq!(uuid.as_bytes()[0], 0x3e);
    assert_eq!(Uuid::from_bytes(*uuid.as_bytes()), uuid);
}

#[test]
fn tags_follow_mysql_rules_and_are_lower_cased() {
    let cases: &[(&str, Result<&str, &str>)] = &[
        ("domain_1", Ok("domain_1")),
        ("Domain_1", Ok("domain_1")),
        ("_", Ok("_")),
        ("a2345678901234567890123456789012", Ok("a2345678901234567890123456789012")),
        ("a23456789012345678901234567890123", Err("at most 32")),
        ("", Err("1 to 32")),
        ("1abc", Err("start with a letter")),
        ("ab-c", Err("only ASCII letters")),
        ("ab c", Err("only ASCII letters")),
        ("tägg", Err("only ASCII letters")),
    ];
    for &(input, expected) in cases {
        match (Tag::new(input), expected) {
            (Ok(tag), Ok(text)) => assert_eq!(tag.as_str(), text),
            (Err(e), Err(needle)) => assert!(e.to_string().contains(needle), "{input}: {e}"),
            (got, want) => panic!("{input:?}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn gtids_parse_and_print() {
    let cases: Vec<(String, Option<String>)> = vec![
        (format!("{U1}:1"), Some(format!("{U1}:1"))),
        ("3E11FA47-71CA-11E1-9E33-C80AA9429562:Domain_1:7".into(), Some(format!("{U1}:domain_1:7"))),
        (format!(" {U1}:9223372036854775806 "), Some(format!("{U1}:9223372036854775806"))),
        (format!("{U1}:0"), None),
        (format!("{U1}:9223372036854775807"), None),
        (format!("{U1}:1-5"), None),
        (format!("{U1}:a:b:1"), None),
        (U1.to_owned(), None),
    ];
    for (input, expected) in cases {
        let parsed = input.parse::<Gtid>().map(|g| g.to_string());
        assert_eq!(parsed.ok(), expected, "{input:?}");
    }
    let uuid = U1.parse().unwrap();
    assert!(Gtid::new(uuid, None, 0).is_err());
    assert!(Gtid::new(uuid, None, MAX_GNO + 1).is_err());
    assert_eq!(Gtid::new(uuid, None, 5).unwrap(), gtid(&format!("{U1}:5")));
}

/// Real `@@gtid_executed` shapes and their canonical form.
#[test]
fn sets_parse_server_output_into_canonical_form() {
    let cases: &[(String, String)] = &[
        (String::new(), String::new()),
        (" \n ".into(), String::new()),
        (format!("{U1}:1-5"), format!("{U1}:1-5")),
        // MySQL's own multi-line output.
        (format!("{U1}:1-5:11-18,\n{U2}:1-9"), format!("{U1}:1-5:11-18,{U2}:1-9")),
        // Upper case and out of order, as a user might paste it.
        (
            "4C2AD77F-697E-11E3-B2E2-C80AA9429562:1-9,\n3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5".into(),
            format!("{U1}:1-5,{U2}:1-9"),
        ),
        // 8.4 tagged form: untagged 1-5, 11; tag domain_1 1-3, 7.
        (format!("{U1}:1-5:11:domain_1:1-3:7"), format!("{U1}:1-5:11:domain_1:1-3:7")),
        // The tagged PREVIOUS_GTIDS of the MySQL 9.6 fixture, in text form.
        (
            "55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-2".into(),
            "55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-2".into(),
        ),
        (format!("{U1}:only_tagged:4"), format!("{U1}:only_tagged:4")),
        (format!("{U1}:Domain_1:1-3"), format!("{U1}:domain_1:1-3")),
        (format!("{U1}:zz:1:aa:2:5"), format!("{U1}:aa:2:5:zz:1")),
        // An interval applies to the current tag; repeating a tag adds to it.
        (format!("{U1}:t:1:2:t:3"), format!("{U1}:t:1-3")),
        (format!("{U1}:4:t:1:u:2:t:2"), format!("{U1}:4:t:1-2:u:2")),
        (format!("{U1}:1-3,{U1}:4-6"), format!("{U1}:1-6")),
        (format!("{U1}:5-9:1-6"), format!("{U1}:1-9")),
        (format!("{U1}:1-3:4-6"), format!("{U1}:1-6")),
        (format!("{U1}:1:3:2"), format!("{U1}:1-3")),
        (format!("{U1}:1-3:5"), format!("{U1}:1-3:5")),
        (format!("{U1}:7-7"), format!("{U1}:7")),
        (format!(" {U1} : 1 - 3 , "), format!("{U1}:1-3")),
        (format!("{U1}:1,,{U2}:2"), format!("{U1}:1,{U2}:2")),
        (format!("{U1}:9223372036854775806"), format!("{U1}:9223372036854775806")),
    ];
    for (input, canonical) in cases {
        let parsed = set(input);
        assert_canonical(&parsed);
        assert_eq!(parsed.to_string(), *canonical, "{input:?}");
        assert_eq!(set(canonical), parsed, "{canonical:?} must round-trip");
    }
}

#[test]
fn sets_reject_malformed_text_with_a_diagnosis() {
    let cases: &[(String, &str)] = &[
        (format!("{U1}:0"), r#"invalid GNO "0""#),
        (format!("{U1}:0-5"), r#"invalid GNO "0""#),
        (format!("{U1}:5-3"), r#"interval "5-3": it ends before it starts"#),
        (format!("{U1}:1-0"), r#"invalid GNO "0""#),
        (format!("{U1}:9223372036854775807"), "invalid GNO"),
        (format!("{U1}:010"), "leading zeros"),
        (format!("{U1}:1x"), r#"invalid GNO "1x""#),
        (format!("{U1}:1 5"), r#"invalid GNO "1 5""#),
        (format!("{U1}:1-2-3"), r#"invalid GNO "2-3""#),
        (format!("{U1}:-1"), r#"invalid GTID tag "-1""#),
        (format!("{U1}:1-5:_:-2"), r#"invalid GTID tag "-2""#),
        (U1.to_owned(), "without any interval"),
        (format!("{U1}:1:tag"), "without any interval"),
        (format!("{U1}:a:b:1"), "without any interval"),
        (format!("{U1}:"), "between each pair of `:`"),
        (format!("{U1}::1"), "between each pair of `:`"),
        ("3e11fa47-71ca-11e1-9e33-c80aa942956:1".into(), "invalid server UUID"),
        ("3e11fa4771ca11e19e33c80aa9429562:1".into(), "invalid server UUID"),
        (format!("{U1}:1;{U2}:2"), "invalid GNO"),
        (format!("{U1}:a23456789012345678901234567890123:1"), "at most 32"),
    ];
    for (input, needle) in cases {
        let error = input.parse::<GtidSet>().expect_err(input).to_string();
        assert!(error.contains(needle), "{input:?}: {error}");
    }
}

/// Guards the off-by-one at both ends of a half-open range.
#[test]
fn contains_is_exact_at_interval_boundaries() {
    let s = set(&format!("{U1}:3-5:7:t:10,{U2}:1"));
    let cases: &[(String, bool)] = &[
        (format!("{U1}:2"), false),
        (format!("{U1}:3"), true),
        (format!("{U1}:5"), true),
        (format!("{U1}:6"), false),
        (format!("{U1}:7"), true),
        (format!("{U1}:8"), false),
        (format!("{U1}:t:9"), false),
        (format!("{U1}:t:10"), true),
        (format!("{U1}:T:10"), true),
        (format!("{U1}:t:11"), false),
        (format!("{U1}:t:3"), false),
        (format!("{U1}:other:3"), false),
        (format!("{U2}:1"), true),
        (format!("{U2}:2"), false),
        ("00000000-0000-0000-0000-000000000001:1".into(), false),
    ];
    for (g, expected) in cases {
        assert_eq!(s.contains(&gtid(g)), *expected, "{g}");
    }
}

#[test]
fn insert_merges_at_edges_and_fills_gaps() {
    let cases: &[(String, String, String, bool)] = &[
        (String::new(), format!("{U1}:1"), format!("{U1}:1"), true),
        (format!("{U1}:1-5"), format!("{U1}:6"), format!("{U1}:1-6"), true),
        (format!("{U1}:2-5"), format!("{U1}:1"), format!("{U1}:1-5"), true),
        (format!("{U1}:1-3:5-7"), format!("{U1}:4"), format!("{U1}:1-7"), true),
        (format!("{U1}:1-3:7-9"), format!("{U1}:5"), format!("{U1}:1-3:5:7-9"), true),
        (format!("{U1}:1-3:7-9"), format!("{U1}:11"), format!("{U1}:1-3:7-9:11"), true),
        (format!("{U1}:1-3"), format!("{U1}:3"), format!("{U1}:1-3"), false),
        (format!("{U1}:1-3"), format!("{U1}:1"), format!("{U1}:1-3"), false),
        (format!("{U1}:1-3"), format!("{U1}:t:1"), format!("{U1}:1-3:t:1"), true),
        (format!("{U2}:1"), format!("{U1}:1"), format!("{U1}:1,{U2}:1"), true),
        (
            format!("{U1}:9223372036854775805"),
            format!("{U1}:9223372036854775806"),
            format!("{U1}:9223372036854775805-9223372036854775806"),
            true,
        ),
    ];
    for (before, g, after, new) in cases {
        let mut s = set(before);
        assert_eq!(s.insert(&gtid(g)), *new, "{before} + {g}");
        assert_canonical(&s);
        assert_eq!(s.to_string(), *after, "{before} + {g}");
    }
}

/// Guards against a zero GNO slipping into a set and poisoning every later comparison.
#[test]
#[should_panic(expected = "outside 1..=")]
fn insert_refuses_gno_zero() {
    let g = Gtid { uuid: U1.parse().unwrap(), tag: None, gno: 0 };
    GtidSet::new().insert(&g);
}

/// The wire's half-open ranges map to the text's closed intervals: the MySQL 9.6 fixture
/// has PREVIOUS_GTIDS {untagged [1,14), mytag [1,3)}, which MySQL prints as `1-13:mytag:1-2`.
#[test]
fn wire_ranges_are_half_open() {
    let uuid: Uuid = "55778904-0299-11f1-b1b8-4ef0c4956feb".parse().unwrap();
    let mytag = Tag::new("mytag").unwrap();
    let mut s = GtidSet::new();
    assert_eq!(s.insert_range(uuid, None, 1..14), Ok(true));
    assert_eq!(s.insert_range(uuid, Some(mytag), 1..3), Ok(true));
    assert_eq!(s.insert_range(uuid, None, 2..5), Ok(false));
    assert_eq!(s, set("55778904-0299-11f1-b1b8-4ef0c4956feb:1-13:mytag:1-2"));
    let groups: Vec<_> = s
        .iter()
        .map(|(u, t, ranges)| {
            let ends: Vec<_> = ranges.iter().map(|r| (r.start, r.end)).collect();
            (*u, t.map(Tag::as_str), ends)
        })
        .collect();
    assert_eq!(groups, vec![(uuid, None, vec![(1, 14)]), (uuid, Some("mytag"), vec![(1, 3)])]);

    let errors: &[(Range<u64>, &str)] =
        &[(3..3, "ends before it starts"), (0..2, r#"invalid GNO "0""#), (1..MAX_GNO + 2, "invalid GNO")];
    for (range, needle) in errors {
        let error = s.insert_range(uuid, None, range.clone()).unwrap_err();
        assert!(error.to_string().contains(needle), "{range:?}: {error}");
    }
    assert_eq!(s.insert_range(uuid, None, MAX_GNO..MAX_GNO + 1), Ok(true));
}

#[test]
fn union_adds_everything_and_merges() {
    let cases: &[(String, String, String)] = &[
        (String::new(), String::new(), String::new()),
        (format!("{U1}:1-3"), String::new(), format!("{U1}:1-3")),
        (format!("{U1}:1-3"), format!("{U1}:4-6"), format!("{U1}:1-6")),
        (format!("{U1}:1-3:9"), format!("{U1}:2-5:t:1"), format!("{U1}:1-5:9:t:1")),
        (format!("{U2}:1"), format!("{U1}:1"), format!("{U1}:1,{U2}:1")),
    ];
    for (a, b, expected) in cases {
        let mut u = set(a);
        u.union(&set(b));
        assert_canonical(&u);
        assert_eq!(u.to_string(), *expected, "{a} ∪ {b}");
    }
}

#[test]
fn compare_is_set_inclusion_and_refuses_to_guess() {
    use Ordering::*;
    let cases: &[(String, String, Option<Ordering>)] = &[
        (String::new(), String::new(), Some(Equal)),
        (String::new(), format!("{U1}:1"), Some(Less)),
        (format!("{U1}:1-5"), format!("{U1}:1-5"), Some(Equal)),
        (format!("{U1}:1-4"), format!("{U1}:1-5"), Some(Less)),
        (format!("{U1}:1-5"), format!("{U1}:2-5"), Some(Greater)),
        (format!("{U1}:1-5"), format!("{U1}:1-5,{U2}:1"), Some(Less)),
        (format!("{U1}:1-5:7"), format!("{U1}:1-7"), Some(Less)),
        // A gap on one side, an extra on the other: diverged.
        (format!("{U1}:1-5:7"), format!("{U1}:1-6"), None),
        (format!("{U1}:1"), format!("{U2}:1"), None),
        (format!("{U1}:1"), format!("{U1}:t:1"), None),
        (format!("{U1}:1-3:t:1"), format!("{U1}:1-3"), Some(Greater)),
    ];
    for (a, b, expected) in cases {
        assert_eq!(set(a).compare(&set(b)), *expected, "{a} vs {b}");
    }
}

// ---- properties ----

const UUIDS: [&str; 3] = [U1, U2, "ffffffff-ffff-ffff-ffff-ffffffffffff"];
const TAGS: [Option<&str>; 3] = [None, Some("a"), Some("domain_1")];

type Model = BTreeSet<(usize, usize, u64)>;

fn make_gtid(u: usize, t: usize, gno: u64) -> Gtid {
    Gtid { uuid: UUIDS[u].parse().unwrap(), tag: TAGS[t].map(|t| Tag::new(t).unwrap()), gno }
}

/// Small GNOs so that ranges collide, plus a few at the top of the range.
fn gno() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 1u64..40, 1 => (MAX_GNO - 12)..=MAX_GNO]
}

/// A set together with the model of exactly which GTIDs it holds.
fn set_and_model() -> impl Strategy<Value = (GtidSet, Model)> {
    prop::collection::vec((0..3usize, 0..3usize, gno(), 0u64..6), 0..10).prop_map(|runs| {
        let mut s = GtidSet::new();
        let mut model = Model::new();
        for (u, t, start, len) in runs {
            let last = start.saturating_add(len).min(MAX_GNO);
            let g = make_gtid(u, t, start);
            s.insert_range(g.uuid, g.tag, start..last + 1).unwrap();
            model.extend((start..=last).map(|n| (u, t, n)));
        }
        (s, model)
    })
}

/// Every GTID the model knows of, and its neighbours, which is where off-by-ones hide.
fn probes(models: &[&Model]) -> BTreeSet<(usize, usize, u64)> {
    models
        .iter()
        .flat_map(|m| m.iter())
        .flat_map(|&(u, t, n)| [n - 1, n, n + 1].map(|n| (u, t, n)))
        .filter(|&(_, _, n)| (1..=MAX_GNO).contains(&n))
        .collect()
}

proptest! {
    #[test]
    fn display_then_parse_is_identity((s, model) in set_and_model()) {
        assert_canonical(&s);
        prop_assert_eq!(set(&s.to_string()), s.clone());
        let json = serde_json::to_string(&s).unwrap();
        prop_assert_eq!(serde_json::from_str::<GtidSet>(&json).unwrap(), s.clone());
        prop_assert_eq!(s.is_empty(), model.is_empty());
    }

    #[test]
    fn contains_matches_the_model_after_inserts(
        (mut s, mut model) in set_and_model(),
        inserts in prop::collection::vec((0..3usize, 0..3usize, gno()), 1..8),
    ) {
        for (u, t, n) in inserts {
            let g = make_gtid(u, t, n);
            prop_assert_eq!(s.insert(&g), model.insert((u, t, n)));
            prop_assert!(s.contains(&g));
        }
        assert_canonical(&s);
        for (u, t, n) in probes(&[&model]) {
            prop_assert_eq!(s.contains(&make_gtid(u, t, n)), model.contains(&(u, t, n)));
        }
    }

    #[test]
    fn union_is_the_smallest_superset_of_both(
        (a, model_a) in set_and_model(),
        (b, model_b) in set_and_model(),
    ) {
        let mut u = a.clone();
        u.union(&b);
        assert_canonical(&u);
        prop_assert!(a.is_subset(&u) && b.is_subset(&u));
        for (x, t, n) in probes(&[&model_a, &model_b]) {
            let expected = model_a.contains(&(x, t, n)) || model_b.contains(&(x, t, n));
            prop_assert_eq!(u.contains(&make_gtid(x, t, n)), expected);
        }
    }

    #[test]
    fn compare_agrees_with_is_subset_and_the_model(
        (a, model_a) in set_and_model(),
        (b, model_b) in set_and_model(),
    ) {
        let (sub, sup) = (a.is_subset(&b), b.is_subset(&a));
        prop_assert_eq!(sub, model_a.is_subset(&model_b));
        prop_assert_eq!(sup, model_b.is_subset(&model_a));
        let expected = match (sub, sup) {
            (true, true) => Some(Ordering::Equal),
            (true, false) => Some(Ordering::Less),
            (false, true) => Some(Ordering::Greater),
            (false, false) => None,
        };
        prop_assert_eq!(a.compare(&b), expected);
        prop_assert_eq!(b.compare(&a), expected.map(Ordering::reverse));
        prop_assert_eq!(a.compare(&b) == Some(Ordering::Equal), a == b);
    }
}

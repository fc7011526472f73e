//! The README's hand-kept copies of the command line and of the configuration, against the real ones.
//!
//! - **Commands** (the code block under `## Commands`): every subcommand the binary's `--help` lists has an
//!   entry, every option and argument of each appears in its entry, every global option in the entry for
//!   all commands (`outbox-cdc [-c …] …`), and no entry names an option its command does not take.
//! - **Configuration** (the tables under `` ### `[section]` `` headings, first column `key`): every key the
//!   config accepts is a row of its section's table, and no row names a key it refuses.
//! - **`connector.toml`**, which the README calls the complete, commented example: every row of every table
//!   is a key of the file (set, or commented out) in that table, every key the file shows is a row of its
//!   table's, and the file as it stands is accepted by `Config::parse`.
//! - **docs/MANAGED-MYSQL.md's `[source]` examples** (its ```` ```toml ```` blocks) are accepted by
//!   `Config::parse`.
//!
//! Both sides are derived, not listed here: the commands from the built binary's help (the clap
//! definition lives in `src/main.rs`, out of a test's reach), the keys from what `Config::parse` itself
//! names as expected when it meets an unknown key (serde's `deny_unknown_fields` message lists every field
//! of the table, `#[serde(from)]` and defaults included), so a new flag or key fails this test until the
//! README documents it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

// --- the command line ------------------------------------------------------------------------------------

/// `outbox-cdc <path…> -h`, as the binary prints it (the short help: one line per entry).
fn help(path: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(path)
        .arg("-h")
        .env_remove("OUTBOX_CDC_CONFIG")
        .env_remove("OUTBOX_CDC_LOG_FORMAT")
        .output()
        .expect("run outbox-cdc -h");
    assert!(output.status.success(), "outbox-cdc {} -h: {output:?}", path.join(" "));
    String::from_utf8(output.stdout).expect("help is UTF-8")
}

/// The lines of one section of clap's help (`Commands:`, `Arguments:`, `Options:`), up to the next title.
fn section<'a>(help: &'a str, title: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|l| l.trim_end() != title)
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .filter(|l| !l.trim().is_empty())
        .collect()
}

/// What one command takes, from its help.
#[derive(Debug, Default)]
struct Takes {
    /// `--long` and `-s` forms of each option, `--help` left out.
    options: BTreeSet<String>,
    /// Positional arguments, lower-cased as the README writes them: `<aggregate_type>`.
    arguments: BTreeSet<String>,
}

fn takes(help: &str) -> Takes {
    let mut takes = Takes::default();
    for line in section(help, "Options:") {
        let line = line.trim_start();
        if !line.starts_with('-') {
            continue; // a wrapped description
        }
        // The option's forms come before its value name and its description.
        let spec = line.split("  ").next().unwrap_or(line);
        for form in spec.split([',', ' ']).filter(|w| w.starts_with('-')) {
            if !matches!(form, "-h" | "--help" | "-V" | "--version") {
                takes.options.insert(form.to_string());
            }
        }
    }
    for line in section(help, "Arguments:") {
        let name = line.split_whitespace().next().unwrap_or("");
        if name.starts_with('<') || name.starts_with('[') {
            let bare = name.trim_matches(|c| matches!(c, '[' | ']' | '.'));
            takes.arguments.insert(bare.to_ascii_lowercase());
        }
    }
    takes
}

/// The subcommands a help lists (entries indented by exactly two spaces), `help` left out.
fn subcommands(help: &str) -> Vec<String> {
    section(help, "Commands:")
        .into_iter()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Every command that runs something (`quarantine release`, not `quarantine`), with what it takes, and the
/// global options (those of the top level, which clap repeats in every command's help).
fn cli() -> (BTreeMap<String, Takes>, Takes) {
    let top = help(&[]);
    let global = takes(&top);
    let mut leaves = BTreeMap::new();
    let mut pending: Vec<Vec<String>> = subcommands(&top).into_iter().map(|c| vec![c]).collect();
    while let Some(path) = pending.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&args);
        let children = subcommands(&text);
        if children.is_empty() {
            let mut own = takes(&text);
            own.options.retain(|o| !global.options.contains(o));
            leaves.insert(path.join(" "), own);
        } else {
            pending.extend(children.into_iter().map(|c| [path.clone(), vec![c]].concat()));
        }
    }
    assert!(leaves.len() >= 5, "found only {leaves:?} in outbox-cdc's help: has its format changed?");
    (leaves, global)
}

/// The README's command list: the first code block after `## Commands`, as entries keyed by the command
/// they show (`""` for the line of options common to all), each with its text, comments dropped. An entry
/// starts with `outbox-cdc`; indented lines continue it.
fn readme_commands(readme: &str) -> BTreeMap<String, String> {
    let block: Vec<&str> = readme
        .lines()
        .skip_while(|l| *l != "## Commands")
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    assert!(!block.is_empty(), "README.md has no code block under `## Commands`");
    let mut entries: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in block {
        let text = line.split(" #").next().unwrap_or(line);
        if let Some(rest) = text.strip_prefix("outbox-cdc ") {
            let path: Vec<&str> = rest
                .split_whitespace()
                .take_while(|w| w.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
                .collect();
            current = Some(path.join(" "));
        }
        let key = current.clone().unwrap_or_else(|| panic!("README command list: {line:?} before any command"));
        let entry = entries.entry(key).or_default();
        entry.push_str(text);
        entry.push('\n');
    }
    entries
}

/// The option-like words of a README entry: `--topic` and `--topic-suffix` are different words.
fn option_words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .filter(|w| {
            w.starts_with('-') && w.len() > 1 && w.chars().nth(1).is_some_and(|c| c == '-' || c.is_ascii_alphabetic())
        })
        .map(str::to_string)
        .collect()
}

/// What is wrong with the README's command list against the binary's help; empty when they agree.
fn command_list_problems(readme: &str) -> Vec<String> {
    let (commands, global) = cli();
    let entries = readme_commands(readme);
    let mut problems = Vec::new();
    match entries.get("") {
        None => problems.push("no entry for the options common to all commands (`outbox-cdc [-c …] …`)".into()),
        Some(text) => {
            let words = option_words(text);
            for option in global.options.difference(&words) {
                problems.push(format!("the common options' entry lacks the global option {option}"));
            }
        }
    }
    for (command, own) in &commands {
        let Some(text) = entries.get(command) else {
            problems.push(format!("no entry for `outbox-cdc {command}`"));
            continue;
        };
        let words = option_words(text);
        for option in own.options.difference(&words) {
            problems.push(format!("`outbox-cdc {command}` lacks its option {option}"));
        }
        for argument in &own.arguments {
            if !text.to_ascii_lowercase().contains(argument.as_str()) {
                problems.push(format!("`outbox-cdc {command}` lacks its argument {argument}"));
            }
        }
        for word in &words {
            if !own.options.contains(word) && !global.options.contains(word) {
                problems.push(format!("`outbox-cdc {command}` shows {word}, which it does not take"));
            }
        }
    }
    for command in entries.keys().filter(|c| !c.is_empty() && !commands.contains_key(*c)) {
        problems.push(format!("an entry for `outbox-cdc {command}`, which is not a command"));
    }
    problems
}

/// Guards against the README's command list drifting from the CLI: a flag added to `src/main.rs` (the list
/// lacked `audit --topic/--limit/--work-dir`, `quarantine release --accept-missing`, `-c` and a global
/// `--log-format`) or one removed from it while the README still shows it.
#[test]
fn readme_command_list_matches_the_cli() {
    let problems = command_list_problems(&readme());
    assert!(problems.is_empty(), "README.md's command list (## Commands) is out of step:\n  {}", problems.join("\n  "));
}

/// The rules above on a help and a README written by hand: a missing option, a missing command, a stale
/// option and a prefix of another option are each found.
#[test]
fn command_list_rules() {
    let help = "Usage: x\n\nCommands:\n  audit  Compare\n          more text\n  help   Print\n\n\
                Arguments:\n  <AGGREGATE_TYPE>  Aggregate\n\nOptions:\n  -c, --config <CONFIG>  Path\n      \
                --topic <TOPIC>  Read\n          wrapped -text\n  -h, --help  Print help\n";
    assert_eq!(subcommands(help), ["audit"]);
    let t = takes(help);
    assert_eq!(t.options.into_iter().collect::<Vec<_>>(), ["--config", "--topic", "-c"]);
    assert_eq!(t.arguments.into_iter().collect::<Vec<_>>(), ["<aggregate_type>"]);
    let readme =
        "## Commands\n\n```\noutbox-cdc [-c|--config f] <command>\noutbox-cdc audit [--topic-suffix X]  # --where\n\
                  \x20                [--json]\noutbox-cdc gone\n```\n";
    let entries = readme_commands(readme);
    assert_eq!(entries.keys().collect::<Vec<_>>(), ["", "audit", "gone"]);
    assert_eq!(option_words(&entries["audit"]).into_iter().collect::<Vec<_>>(), ["--json", "--topic-suffix"]);
    assert_eq!(option_words(&entries[""]).into_iter().collect::<Vec<_>>(), ["--config", "-c"]);
}

// --- the configuration -----------------------------------------------------------------------------------

/// A key no table has: `Config::parse` refuses it and lists the keys it expected instead.
const PROBE: &str = "zz_probe_not_a_key";

/// The keys the table at `path` (`[]` for the top level, `["outbox", "columns"]`) accepts, as the loader
/// names them when it refuses [`PROBE`]; `None` when `path` is not a table with fixed keys (a scalar, a
/// free-form map such as `[kafka.properties]`).
fn accepted_keys(path: &[&str]) -> Option<BTreeSet<String>> {
    let header = if path.is_empty() { String::new() } else { format!("[{}]\n", path.join(".")) };
    let error = match outbox_cdc::config::Config::parse(&format!("{header}{PROBE} = 1\n")) {
        Ok(_) => return None,
        Err(e) => e.to_string(),
    };
    let (_, expected) = error.split_once(&format!("unknown field `{PROBE}`, expected "))?;
    let expected = expected.split(['\n', ';']).next().unwrap_or(expected);
    let keys: BTreeSet<String> = expected.split('`').skip(1).step_by(2).map(str::to_string).collect();
    assert!(!keys.is_empty(), "{}: cannot read the expected keys from {error:?}", path.join("."));
    Some(keys)
}

/// Every table of the configuration with fixed keys (`""` for the top level, `"outbox.columns"`) and its
/// keys, found from the top down.
fn config_tables() -> BTreeMap<String, BTreeSet<String>> {
    let top = accepted_keys(&[]).expect("the top level refuses unknown keys");
    let mut tables = BTreeMap::new();
    for section in &top {
        let keys = accepted_keys(&[section]).unwrap_or_else(|| panic!("[{section}] accepts unknown keys"));
        for key in &keys {
            if let Some(sub) = accepted_keys(&[section, key]) {
                tables.insert(format!("{section}.{key}"), sub);
            }
        }
        tables.insert(section.clone(), keys);
    }
    tables.insert(String::new(), top);
    tables
}

/// The README's configuration tables: under each `` ### `[section]` `` (or `####`) heading, the first table
/// whose first column is `key` (code blocks skipped), as the keys its rows name. A row may name several (`` `host` / `port` ``);
/// a sub-table row names it in brackets (`` `[kafka.properties]` `` is the key `properties`).
fn readme_config_tables(readme: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut tables = BTreeMap::new();
    let mut section: Option<String> = None;
    let mut in_table = false;
    let mut in_code = false;
    for line in readme.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue; // a `# comment` there is no heading
        }
        if line.starts_with('#') {
            let title = line.trim_start_matches('#').trim();
            section = title.strip_prefix("`[").and_then(|t| t.strip_suffix("]`")).map(str::to_string);
            in_table = false;
            continue;
        }
        let Some(name) = &section else { continue };
        if line.starts_with("| key |") && !tables.contains_key(name) {
            in_table = true;
            tables.insert(name.clone(), BTreeSet::new());
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if in_table && !line.starts_with("|---") {
            let first = line.split('|').nth(1).unwrap_or("");
            let keys = tables.get_mut(name).expect("inserted at the header");
            for token in first.split('`').skip(1).step_by(2) {
                let key = token.trim_start_matches('[').trim_end_matches(']');
                keys.insert(key.rsplit('.').next().unwrap_or(key).to_string());
            }
        }
    }
    tables
}

/// What is wrong with the README's configuration tables against the loader; empty when they agree.
fn config_table_problems(readme: &str) -> Vec<String> {
    let accepted = config_tables();
    let documented = readme_config_tables(readme);
    let mut problems = Vec::new();
    for (table, keys) in accepted.iter().filter(|(t, _)| !t.is_empty()) {
        let Some(rows) = documented.get(table) else {
            problems.push(format!("no table for [{table}] (keys {keys:?})"));
            continue;
        };
        for key in keys.difference(rows) {
            problems.push(format!("[{table}] {key} is accepted but has no row"));
        }
        for key in rows.difference(keys) {
            problems.push(format!("[{table}] {key} has a row but is refused as an unknown key"));
        }
    }
    for table in documented.keys().filter(|t| !accepted.contains_key(*t)) {
        problems.push(format!("a table for [{table}], which the configuration does not have"));
    }
    problems
}

/// Guards against the README's configuration reference drifting from `src/config/`: a key added without a
/// row (the `[kafka]` table lacked `properties_env` and `properties_file`), or a row left for a key that was
/// renamed or removed (a config written from it would be refused: unknown keys are errors).
#[test]
fn readme_config_tables_match_the_config() {
    let problems = config_table_problems(&readme());
    assert!(problems.is_empty(), "README.md's configuration reference is out of step:\n  {}", problems.join("\n  "));
}

/// The probe and the README parser on known cases: the loader's own lists, a sub-table, a free-form map,
/// and a README table with a missing and an unknown key.
#[test]
fn config_table_rules() {
    let tables = config_tables();
    assert!(tables[""].contains("source") && tables[""].contains("kafka"), "{tables:?}");
    assert!(tables["source"].contains("password_file"), "{tables:?}");
    assert!(tables["outbox.columns"].contains("aggregate_id"), "{tables:?}");
    assert!(!tables.contains_key("kafka.properties"), "a free-form map has no fixed keys");
    let readme = "### `[delivery]`\n| key | default | meaning |\n|---|---|---|\n| `guarantee` / `nonsense` | x | y |\n\
                  | `[delivery.sub]` | — | z |\n\nprose | not a row\n";
    let parsed = readme_config_tables(readme);
    assert_eq!(parsed["delivery"].iter().collect::<Vec<_>>(), ["guarantee", "nonsense", "sub"]);
    let problems = config_table_problems(readme);
    assert!(
        problems.iter().any(|p| p == "[delivery] nonsense has a row but is refused as an unknown key"),
        "{problems:?}"
    );
    assert!(problems.iter().any(|p| p == "[delivery] failover_timeout_ms is accepted but has no row"), "{problems:?}");
    assert!(problems.iter().any(|p| p.starts_with("no table for [source]")), "{problems:?}");
}

// --- connector.toml --------------------------------------------------------------------------------------

fn example() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("connector.toml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// What a line of `connector.toml` holds, read the same whether it is commented out or not.
#[derive(Debug, PartialEq)]
enum ExampleLine {
    /// `[a.b]`, alone on its line but for a comment: opens the table `a.b`.
    Table(String),
    /// `key = value` or `"quoted.key" = value`: a key of the open table, its quotes dropped.
    Key(String),
    /// Prose, a blank line, the continuation of a value.
    Other,
}

/// Whether `c` may be part of a bare TOML key (`server_id`, `lock_wait_timeout_s`).
fn in_bare_key(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// Reads a line of `connector.toml`. The rule that tells a commented-out key from prose: a comment whose
/// text (after the `#` and any spaces) begins with a key and `=` (`# port = 3306`, `# "sasl.mechanism" = …`)
/// or is a table header (`# [poll]`, perhaps followed by a comment) is commented-out TOML; any other comment
/// is prose. So prose never begins with `word =` or with a header alone: `# with kind = "poll", …` and
/// `# [state] backend = "kafka" …` are prose, `# kind = "poll"` is a key.
fn example_line(line: &str) -> ExampleLine {
    let line = line.trim_start();
    let text = line.strip_prefix('#').map_or(line, str::trim_start);
    if let Some(rest) = text.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((name, after))
                if name.split('.').all(|part| !part.is_empty() && part.chars().all(in_bare_key))
                    && (after.trim().is_empty() || after.trim_start().starts_with('#')) =>
            {
                ExampleLine::Table(name.to_string())
            }
            _ => ExampleLine::Other,
        };
    }
    let (key, after) = match text.strip_prefix('"') {
        Some(quoted) => quoted.split_once('"').unwrap_or(("", "")),
        None => text.split_at(text.find(|c: char| !in_bare_key(c)).unwrap_or(text.len())),
    };
    if !key.is_empty() && after.trim_start().starts_with('=') {
        ExampleLine::Key(key.to_string())
    } else {
        ExampleLine::Other
    }
}

/// `connector.toml` as tables, like the README's: each table the file opens (commented out or not) with the
/// keys written in it (set or commented out) and the sub-tables opened under it (`[kafka.properties]` is the
/// key `properties` of `kafka`); `""` holds keys before the first header. Second, each commented-out key
/// that is not TOML (it would not load once uncommented), by line.
fn example_tables(example: &str) -> (BTreeMap<String, BTreeSet<String>>, Vec<String>) {
    let mut tables: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut malformed = Vec::new();
    let mut table = String::new();
    for (number, line) in example.lines().enumerate() {
        match example_line(line) {
            ExampleLine::Table(name) => {
                if let Some((parent, key)) = name.rsplit_once('.') {
                    tables.entry(parent.to_string()).or_default().insert(key.to_string());
                }
                tables.entry(name.clone()).or_default();
                table = name;
            }
            ExampleLine::Key(key) => {
                if let Some(text) = line.trim_start().strip_prefix('#') {
                    if let Err(e) = toml::from_str::<toml::Table>(text.trim()) {
                        let e = e.message().to_string();
                        malformed
                            .push(format!("line {}: {line:?} is a commented-out key but not TOML: {e}", number + 1));
                    }
                }
                tables.entry(table.clone()).or_default().insert(key);
            }
            ExampleLine::Other => {}
        }
    }
    (tables, malformed)
}

/// What is wrong with `example` (a `connector.toml`) against the README's configuration tables; empty when
/// every row is a key of the file in its table, and every key of the file a row of its table's. A table the
/// README has none for is a free-form map when its parent's table has a row for it (`[kafka.properties]`):
/// its keys are librdkafka's, not ours, and go unchecked.
fn example_problems(readme: &str, example: &str) -> Vec<String> {
    let documented = readme_config_tables(readme);
    let (shown, mut problems) = example_tables(example);
    let none = BTreeSet::new();
    for (table, rows) in &documented {
        for key in rows.difference(shown.get(table).unwrap_or(&none)) {
            problems.push(format!("[{table}] {key} has a README row but is not in connector.toml"));
        }
    }
    for (table, keys) in &shown {
        match documented.get(table) {
            Some(rows) => {
                for key in keys.difference(rows) {
                    problems.push(format!("[{table}] {key} is in connector.toml but has no README row"));
                }
            }
            None => {
                let map = table
                    .rsplit_once('.')
                    .is_some_and(|(parent, key)| documented.get(parent).is_some_and(|rows| rows.contains(key)));
                if !map {
                    problems.push(format!("[{table}] is in connector.toml, but the README has no table for it"));
                }
            }
        }
    }
    problems
}

/// Guards against `connector.toml`, which the README calls the complete, commented example, falling behind
/// the README's tables (it lacked all of `[schema_registry]`, `[source] tls`, `[kafka] dead_letter_topic` and
/// more, so whoever started from it never met them), or showing a key the tables do not (a stale one).
#[test]
fn connector_toml_shows_every_documented_key() {
    let problems = example_problems(&readme(), &example());
    assert!(problems.is_empty(), "connector.toml is out of step with README.md's tables:\n  {}", problems.join("\n  "));
}

/// Guards against shipping an example the connector refuses at start (tests/deploy.rs loads the configs of
/// `deploy/`, not this one): the file as it stands, its commented-out keys left out, is accepted.
#[test]
fn connector_toml_is_accepted() {
    outbox_cdc::config::Config::parse(&example()).unwrap_or_else(|e| panic!("connector.toml is refused: {e}"));
}

/// The line reader and the checker on an example and a README written by hand: prose is told from
/// commented-out keys, and a missing key, an extra key, a key in the wrong table, a table the README lacks
/// and a commented-out key that is not TOML are each found, while a free-form map's keys are not checked.
#[test]
fn example_rules() {
    use ExampleLine::{Key, Other, Table};
    let lines = [
        ("host = \"h\"", Key("host".into())),
        ("# port = 3306   # a note", Key("port".into())),
        ("#batch_rows=1", Key("batch_rows".into())),
        ("# \"sasl.mechanism\" = \"PLAIN\"", Key("sasl.mechanism".into())),
        ("[kafka.properties]  # librdkafka's", Table("kafka.properties".into())),
        ("# [poll]", Table("poll".into())),
        ("# The password comes from this variable.", Other),
        ("# with kind = \"poll\", remove server_id", Other),
        ("# [state] backend = \"kafka\" needs it", Other),
        ("# \"server\" (default) or \"files\"", Other),
        ("#                # the comment's second line", Other),
        ("  \"b\",", Other),
        ("", Other),
    ];
    for (line, expected) in lines {
        assert_eq!(example_line(line), expected, "{line:?}");
    }
    let readme = "### `[source]`\n| key | default | meaning |\n|---|---|---|\n| `host` | — | a |\n\
                  | `password` / `password_env` | — | b |\n| `server_id` | — | c |\n\n\
                  ### `[kafka]`\n| key | default | meaning |\n|---|---|---|\n| `topic` | x | d |\n\
                  | `[kafka.properties]` | — | e |\n";
    let example = "[source]\nhost = \"h\"\n# password = \"secret\"\n# The password, or password_env.\n\n\
                   [kafka]\nserver_id = 1\ntopic = \"t\"\n# extra = 2\n\n[kafka.properties]\n\"linger.ms\" = \"5\"\n\n\
                   # [poll]\n# bad = [unclosed\n";
    let mut problems = example_problems(readme, example);
    problems.sort();
    let problems: Vec<&str> = problems.iter().map(|p| p.split(": ").next().unwrap_or(p)).collect();
    assert_eq!(
        problems,
        [
            "[kafka] extra is in connector.toml but has no README row",
            "[kafka] server_id is in connector.toml but has no README row",
            "[poll] is in connector.toml, but the README has no table for it",
            "[source] password_env has a README row but is not in connector.toml",
            "[source] server_id has a README row but is not in connector.toml",
            "line 15",
        ]
    );
}

/// The ```` ```toml ```` blocks of `markdown` (indentation removed), in order.
fn toml_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        match &mut current {
            None if trimmed == "```toml" => current = Some((line.len() - trimmed.len(), String::new())),
            None => {}
            Some(_) if trimmed == "```" => blocks.push(current.take().expect("in a block").1),
            Some((indent, text)) => {
                text.push_str(line.get(*indent..).unwrap_or(""));
                text.push('\n');
            }
        }
    }
    blocks
}

/// Guards against a configuration example of docs/MANAGED-MYSQL.md (the `[source]` of each database
/// identity) that the loader refuses: each block, completed with the `[outbox]` and `[kafka]` it leaves out,
/// is accepted by `Config::parse`.
#[test]
fn managed_mysql_config_examples_parse() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/MANAGED-MYSQL.md");
    let text = std::fs::read_to_string(&path).expect("read docs/MANAGED-MYSQL.md");
    let blocks = toml_blocks(&text);
    assert!(blocks.len() >= 3, "the identity examples: {blocks:#?}");
    for block in blocks {
        let mut config = block.clone();
        if !config.contains("[outbox]") {
            config.push_str("\n[outbox]\ntable = \"shop.outbox_events\"\n");
        }
        if !config.contains("[kafka]") {
            config.push_str("\n[kafka]\nbootstrap_servers = \"kafka:9092\"\n");
        }
        if let Err(e) = outbox_cdc::config::Config::parse(&config) {
            panic!("docs/MANAGED-MYSQL.md's example is refused: {e}\n{block}");
        }
    }
}

/// Guards against a Kafka authentication example of the README (SCRAM, OIDC, MSK IAM) that the loader
/// refuses: each block of the section, completed with the `[source]` and `[outbox]` it leaves out (and the
/// `[kafka]` line where it shows only properties), is accepted by `Config::parse`.
#[test]
fn readme_kafka_authentication_examples_parse() {
    let text = readme();
    let start = text.find("#### Kafka authentication").expect("the README's Kafka authentication section");
    let section = &text[start..];
    let end = section.find("\n### ").unwrap_or(section.len());
    let blocks = toml_blocks(&section[..end]);
    assert!(blocks.len() >= 3, "SCRAM, OIDC and MSK IAM: {blocks:#?}");
    for block in blocks {
        let mut config = String::from(
            "[source]\nhost = \"db\"\nuser = \"cdc\"\npassword = \"pw\"\nserver_id = 1000\n\n\
             [outbox]\ntable = \"shop.outbox_events\"\n\n",
        );
        if !block.contains("[kafka]\n") {
            config.push_str("[kafka]\nbootstrap_servers = \"kafka:9092\"\n");
        }
        config.push_str(&block);
        if let Err(e) = outbox_cdc::config::Config::parse(&config) {
            panic!("the README's Kafka authentication example is refused: {e}\n{block}");
        }
    }
}

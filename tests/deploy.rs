//! The deployment files (`deploy/`) against the connector itself: every metric the Grafana dashboard and
//! the PrometheusRule query is one the running binary exposes on `/metrics`, every alert's expression
//! gives the expected answer on the pages of a real active and standby pair, and the shipped configs are
//! ones it accepts. The schema, unit-file and compose checks that need no binary are in
//! `scripts/check-deploy`.
//!
//! No Prometheus server runs here: [`promql`] evaluates the subset of PromQL the rules are written in, and
//! refuses anything else, so a rule outside it fails this test instead of going unchecked.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::{free_port, insert_event, wait_until, Broker, Connector, Engine, MariaDb, OutboxRow};

/// Files whose queries name our metrics, relative to the repository root.
const QUERYING_FILES: &[&str] =
    &["deploy/grafana/outbox-cdc.json", "deploy/kubernetes/prometheus-operator/prometheusrule.yaml"];

/// Every series name a Prometheus server can store from this page: each sample's name, and for each
/// `# TYPE` line the names its type produces.
fn exposed_series(page: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in page.lines() {
        if let Some(declaration) = line.strip_prefix("# TYPE ") {
            let mut parts = declaration.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            if let Some(name) = line.split(['{', ' ']).next().filter(|n| !n.is_empty()) {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// The `outbox_cdc_*` identifiers in a file's text (queries, legends, descriptions alike).
fn referenced_metrics(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("outbox_cdc_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        found.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    found
}

/// Guards against a dashboard panel or an alert that silently shows "no data" forever: a metric renamed
/// or removed in `src/metrics.rs` (or misspelled in `deploy/`) while the dashboard and the alert rules
/// still query the old name.
#[tokio::test(flavor = "multi_thread")]
async fn dashboard_and_alerts_query_only_exposed_metrics() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    // Labelled families (per topic, partition, aggregate type) appear on the page with their first
    // event: stream a few, as in production.
    let mut conn = db.conn().await;
    for i in 0..3 {
        insert_event(&mut conn, &OutboxRow::new(format!("A-{i}"))).await.unwrap();
    }
    let port = free_port();
    let connector = Connector::start(&db, &broker, &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    let mut page = None;
    assert!(
        wait_until(Duration::from_secs(120), || {
            page = common::scrape(port);
            page.as_deref().is_some_and(|p| {
                p.contains("outbox_cdc_end_to_end_latency_seconds_count{")
                    && p.contains("outbox_cdc_partition_events_total{")
            })
        }),
        "/metrics never showed the streamed events: {page:?}\n{}",
        connector.logs()
    );
    let exposed = exposed_series(&page.expect("scraped above"));

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in QUERYING_FILES {
        let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("read {file}: {e}"));
        let referenced = referenced_metrics(&text);
        assert!(!referenced.is_empty(), "{file} queries no outbox_cdc_* metric: is this the right file?");
        let missing: Vec<_> = referenced.difference(&exposed).collect();
        assert!(
            missing.is_empty(),
            "{file} queries metrics that /metrics does not expose: {missing:?}\nexposed: {exposed:?}"
        );
    }
}

/// The `connector.toml` a file embeds as a YAML block scalar (`  connector.toml: |`), unindented.
fn embedded_toml(yaml: &str) -> String {
    let lines = yaml.lines().skip_while(|l| l.trim() != "connector.toml: |").skip(1);
    let first = lines.clone().find(|l| !l.trim().is_empty()).expect("connector.toml block is empty");
    let indent = first.len() - first.trim_start().len();
    lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent)
        .map(|l| l.get(indent..).unwrap_or("").to_string() + "\n")
        .collect()
}

/// Guards against shipping a config the connector refuses at start (an invented or misspelled key: unknown
/// keys are definite errors, so a pod or container would crash-loop on its first start).
#[test]
fn shipped_configs_are_accepted_by_the_connector() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in ["deploy/kubernetes/configmap.yaml", "deploy/kubernetes/active-standby/configmap.yaml"] {
        let configmap = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("read {file}: {e}"));
        let from_configmap = embedded_toml(&configmap);
        assert!(from_configmap.contains("[state]"), "{file}: the block ended early:\n{from_configmap}");
        outbox_cdc::config::Config::parse(&from_configmap).unwrap_or_else(|e| panic!("{file}: {e}\n{from_configmap}"));
    }
    let compose = std::fs::read_to_string(root.join("deploy/connector.docker.toml")).unwrap();
    outbox_cdc::config::Config::parse(&compose).unwrap_or_else(|e| panic!("deploy/connector.docker.toml: {e}"));
}

/// The rules of `exposed_series` and `referenced_metrics`, on a page and queries written by hand.
#[test]
fn series_names_follow_each_metric_type() {
    let page = "# HELP a x.\n# TYPE outbox_cdc_a counter\n# TYPE outbox_cdc_h histogram\n\
                # TYPE outbox_cdc_g gauge\noutbox_cdc_g 1\noutbox_cdc_a_total{topic=\"t\"} 3\n# EOF\n";
    let exposed = exposed_series(page);
    for name in ["outbox_cdc_a_total", "outbox_cdc_h_bucket", "outbox_cdc_h_sum", "outbox_cdc_h_count", "outbox_cdc_g"]
    {
        assert!(exposed.contains(name), "{name} missing from {exposed:?}");
    }
    assert!(!exposed.contains("outbox_cdc_a"), "a counter is stored as name_total only");
    let referenced =
        referenced_metrics("rate(outbox_cdc_a_total{x=\"y\"}[5m]) / outbox_cdc_g > 0\nexpr: outbox_cdc_h_bucket");
    assert_eq!(
        referenced.into_iter().collect::<Vec<_>>(),
        ["outbox_cdc_a_total", "outbox_cdc_g", "outbox_cdc_h_bucket"]
    );
}

/// The subset of PromQL the shipped rules are written in, evaluated on scraped pages.
///
/// Supported: selectors with `=`/`!=` label matchers; `increase` and `rate` over a range selector; `sum`,
/// `max`, `min` and `count`, optionally `by (labels)`; comparisons of a vector with a number (filters);
/// `and`, `unless` and `or` with matching on all labels; parentheses. Everything else is a parse error.
mod promql {
    use std::collections::BTreeMap;

    /// A series' labels, without its name (set operators and aggregations ignore the name, as in Prometheus).
    pub type Labels = BTreeMap<String, String>;

    /// One sample of a page: name, labels (the target's `job` and `instance` added) and value.
    #[derive(Debug, Clone)]
    pub struct Sample {
        pub name: String,
        pub labels: Labels,
        pub value: f64,
    }

    /// What Prometheus would have stored from the targets of one job: per target, its scrapes in time
    /// order, all within any range a rule uses. Instant selectors read each target's last scrape; `up` is 1
    /// for every target (each was scraped).
    #[derive(Debug, Default)]
    pub struct Store {
        /// Per target: its scrapes, oldest first.
        pub targets: Vec<Vec<Vec<Sample>>>,
    }

    impl Store {
        /// Adds a target's scrapes (`/metrics` bodies, oldest first) as `job`/`instance`.
        pub fn add_target(&mut self, job: &str, instance: &str, pages: &[String]) {
            let target = [("job", job), ("instance", instance)];
            let mut scrapes: Vec<Vec<Sample>> = pages.iter().map(|p| parse_page(p, &target)).collect();
            for scrape in &mut scrapes {
                let labels = target.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
                scrape.push(Sample { name: "up".into(), labels, value: 1.0 });
            }
            self.targets.push(scrapes);
        }
    }

    /// The samples of an OpenMetrics page, each with `extra` labels added.
    pub fn parse_page(page: &str, extra: &[(&str, &str)]) -> Vec<Sample> {
        let mut samples = Vec::new();
        for line in page.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("a sample without a value: {line:?}"));
            let name = line[..name_end].to_string();
            let mut labels: Labels = extra.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let mut rest = &line[name_end..];
            if let Some(inner) = rest.strip_prefix('{') {
                let mut chars = inner.char_indices();
                let mut key = String::new();
                let end = loop {
                    let Some((i, c)) = chars.next() else { panic!("unterminated labels: {line:?}") };
                    match c {
                        '}' => break i,
                        ',' => {}
                        '=' => {
                            assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "label value not quoted: {line:?}");
                            let mut value = String::new();
                            loop {
                                match chars.next() {
                                    Some((_, '\\')) => match chars.next() {
                                        Some((_, 'n')) => value.push('\n'),
                                        Some((_, other)) => value.push(other),
                                        None => panic!("unterminated label value: {line:?}"),
                                    },
                                    Some((_, '"')) => break,
                                    Some((_, other)) => value.push(other),
                                    None => panic!("unterminated label value: {line:?}"),
                                }
                            }
                            labels.insert(std::mem::take(&mut key), value);
                        }
                        c => key.push(c),
                    }
                };
                rest = &inner[end + 1..];
            }
            let value = rest.split_whitespace().next().unwrap_or_else(|| panic!("no value: {line:?}"));
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|e| panic!("value {v:?} of {line:?}: {e}")),
            };
            samples.push(Sample { name, labels, value });
        }
        samples
    }

    /// An instant vector: label sets and values.
    pub type Vector = Vec<(Labels, f64)>;

    #[derive(Debug)]
    enum Expr {
        Selector(Selector),
        Range { function: String, selector: Selector, seconds: f64 },
        Aggregate { op: String, by: Option<Vec<String>>, inner: Box<Expr> },
        Compare { left: Box<Expr>, op: String, number: f64 },
        Set { left: Box<Expr>, op: String, right: Box<Expr> },
    }

    #[derive(Debug)]
    struct Selector {
        name: String,
        /// (label, equal?, value)
        matchers: Vec<(String, bool, String)>,
    }

    impl Selector {
        fn matches(&self, sample: &Sample) -> bool {
            sample.name == self.name
                && self.matchers.iter().all(|(label, equal, value)| {
                    (sample.labels.get(label).map(String::as_str).unwrap_or("") == value) == *equal
                })
        }
    }

    /// Evaluates `expr` at the time of the store's last scrapes: the series an alert of that expression
    /// fires for (before its `for`).
    ///
    /// # Panics
    /// On anything outside the subset: extend this evaluator or keep the rule inside it.
    pub fn eval(expr: &str, store: &Store) -> Vector {
        let tokens = tokenize(expr);
        let mut parser = Parser { tokens: &tokens, at: 0, text: expr };
        let tree = parser.or_expr();
        assert!(parser.at == tokens.len(), "{expr}: unexpected {:?}", &tokens[parser.at..]);
        evaluate(&tree, store)
    }

    fn tokenize(expr: &str) -> Vec<String> {
        let mut tokens = Vec::new();
        let chars: Vec<char> = expr.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c.is_whitespace() {
                i += 1;
            } else if c == '"' {
                let start = i;
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                tokens.push(chars[start..i.min(chars.len())].iter().collect());
            } else if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.') {
                    i += 1;
                }
                tokens.push(chars[start..i].iter().collect());
            } else {
                let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
                if matches!(two.as_str(), "==" | "!=" | ">=" | "<=") {
                    tokens.push(two);
                    i += 2;
                } else {
                    tokens.push(c.to_string());
                    i += 1;
                }
            }
        }
        tokens
    }

    struct Parser<'a> {
        tokens: &'a [String],
        at: usize,
        text: &'a str,
    }

    impl Parser<'_> {
        fn peek(&self) -> Option<&str> {
            self.tokens.get(self.at).map(String::as_str)
        }

        fn next(&mut self) -> String {
            let token = self.tokens.get(self.at).unwrap_or_else(|| panic!("{}: ends too early", self.text)).clone();
            self.at += 1;
            token
        }

        fn expect(&mut self, token: &str) {
            let got = self.next();
            assert_eq!(got, token, "{}: expected {token:?}", self.text);
        }

        /// `or` binds loosest, then `and`/`unless`, then comparisons (PromQL's precedence).
        fn or_expr(&mut self) -> Expr {
            let mut left = self.and_expr();
            while self.peek() == Some("or") {
                self.next();
                let right = self.and_expr();
                left = Expr::Set { left: Box::new(left), op: "or".into(), right: Box::new(right) };
            }
            left
        }

        fn and_expr(&mut self) -> Expr {
            let mut left = self.comparison();
            while let Some(op @ ("and" | "unless")) = self.peek() {
                let op = op.to_string();
                self.next();
                assert!(
                    self.peek() != Some("on") && self.peek() != Some("ignoring"),
                    "{}: no on()/ignoring()",
                    self.text
                );
                let right = self.comparison();
                left = Expr::Set { left: Box::new(left), op, right: Box::new(right) };
            }
            left
        }

        fn comparison(&mut self) -> Expr {
            let left = self.operand();
            match self.peek() {
                Some(op @ ("==" | "!=" | ">" | "<" | ">=" | "<=")) => {
                    let op = op.to_string();
                    self.next();
                    let number = self.next();
                    let number = number.parse().unwrap_or_else(|_| panic!("{}: only a number after {op}", self.text));
                    Expr::Compare { left: Box::new(left), op, number }
                }
                _ => left,
            }
        }

        fn operand(&mut self) -> Expr {
            let word = self.next();
            match word.as_str() {
                "(" => {
                    let inner = self.or_expr();
                    self.expect(")");
                    inner
                }
                "sum" | "max" | "min" | "count" => {
                    let by = if self.peek() == Some("by") {
                        self.next();
                        self.expect("(");
                        let mut labels = Vec::new();
                        loop {
                            let label = self.next();
                            if label == ")" {
                                break;
                            }
                            if label != "," {
                                labels.push(label);
                            }
                        }
                        Some(labels)
                    } else {
                        None
                    };
                    self.expect("(");
                    let inner = self.or_expr();
                    self.expect(")");
                    assert!(self.peek() != Some("by"), "{}: write `{word} by (…) (…)`", self.text);
                    Expr::Aggregate { op: word, by, inner: Box::new(inner) }
                }
                "increase" | "rate" => {
                    self.expect("(");
                    let name = self.next();
                    let selector = self.selector(name);
                    self.expect("[");
                    let duration = self.next();
                    self.expect("]");
                    self.expect(")");
                    Expr::Range { function: word, selector, seconds: seconds(&duration, self.text) }
                }
                name if name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') => {
                    let name = name.to_string();
                    Expr::Selector(self.selector(name))
                }
                other => panic!("{}: unsupported {other:?}", self.text),
            }
        }

        fn selector(&mut self, name: String) -> Selector {
            let mut matchers = Vec::new();
            if self.peek() == Some("{") {
                self.next();
                loop {
                    let label = self.next();
                    match label.as_str() {
                        "}" => break,
                        "," => continue,
                        _ => {}
                    }
                    let op = self.next();
                    assert!(op == "=" || op == "!=", "{}: only = and != matchers, not {op}", self.text);
                    let value = self.next();
                    let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"'));
                    let value = value.unwrap_or_else(|| panic!("{}: a matcher's value is quoted", self.text));
                    matchers.push((label, op == "=", value.to_string()));
                }
            }
            Selector { name, matchers }
        }
    }

    fn seconds(duration: &str, text: &str) -> f64 {
        let (number, unit) = duration.split_at(duration.find(|c: char| !c.is_ascii_digit()).unwrap_or(duration.len()));
        let number: f64 = number.parse().unwrap_or_else(|_| panic!("{text}: duration {duration}"));
        number
            * match unit {
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => panic!("{text}: duration {duration}: only s, m and h"),
            }
    }

    fn evaluate(expr: &Expr, store: &Store) -> Vector {
        match expr {
            Expr::Selector(selector) => store
                .targets
                .iter()
                .filter_map(|scrapes| scrapes.last())
                .flatten()
                .filter(|s| selector.matches(s))
                .map(|s| (s.labels.clone(), s.value))
                .collect(),
            Expr::Range { function, selector, seconds } => {
                let mut out = Vector::new();
                for scrapes in &store.targets {
                    let mut series: BTreeMap<&Labels, Vec<f64>> = BTreeMap::new();
                    for sample in scrapes.iter().flatten().filter(|s| selector.matches(s)) {
                        series.entry(&sample.labels).or_default().push(sample.value);
                    }
                    for (labels, values) in series.into_iter().filter(|(_, v)| v.len() >= 2) {
                        // A counter that went down was reset: count from 0 again.
                        let increase: f64 =
                            values.windows(2).map(|w| if w[1] >= w[0] { w[1] - w[0] } else { w[1] }).sum();
                        let value = if function == "rate" { increase / seconds } else { increase };
                        out.push((labels.clone(), value));
                    }
                }
                out
            }
            Expr::Aggregate { op, by, inner } => {
                let mut groups: BTreeMap<Labels, Vec<f64>> = BTreeMap::new();
                for (labels, value) in evaluate(inner, store) {
                    let key = match by {
                        Some(by) => by.iter().filter_map(|l| labels.get(l).map(|v| (l.clone(), v.clone()))).collect(),
                        None => Labels::new(),
                    };
                    groups.entry(key).or_default().push(value);
                }
                groups
                    .into_iter()
                    .map(|(labels, values)| {
                        let value = match op.as_str() {
                            "sum" => values.iter().sum(),
                            "max" => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                            "min" => values.iter().copied().fold(f64::INFINITY, f64::min),
                            _ => values.len() as f64,
                        };
                        (labels, value)
                    })
                    .collect()
            }
            Expr::Compare { left, op, number } => evaluate(left, store)
                .into_iter()
                .filter(|(_, v)| match op.as_str() {
                    "==" => v == number,
                    "!=" => v != number,
                    ">" => v > number,
                    "<" => v < number,
                    ">=" => v >= number,
                    _ => v <= number,
                })
                .collect(),
            Expr::Set { left, op, right } => {
                let (left, right) = (evaluate(left, store), evaluate(right, store));
                let in_right = |labels: &Labels| right.iter().any(|(r, _)| r == labels);
                match op.as_str() {
                    "and" => left.into_iter().filter(|(l, _)| in_right(l)).collect(),
                    "unless" => left.into_iter().filter(|(l, _)| !in_right(l)).collect(),
                    _ => {
                        let extra: Vector =
                            right.iter().filter(|(r, _)| !left.iter().any(|(l, _)| l == r)).cloned().collect();
                        left.into_iter().chain(extra).collect()
                    }
                }
            }
        }
    }
}

const RULES: &str = "deploy/kubernetes/prometheus-operator/prometheusrule.yaml";

/// Each alert of the PrometheusRule with its expression (written on one line: `expr: …`).
fn alerts() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(RULES)).expect("read the rules");
    let mut alerts = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if let Some(name) = line.strip_prefix("- alert: ") {
            let expr = lines
                .next()
                .and_then(|l| l.strip_prefix("expr: "))
                .unwrap_or_else(|| panic!("{RULES}: {name}: `expr:` must follow `alert:` on the next line"));
            assert!(!matches!(expr, "|" | ">" | "|-" | ">-"), "{RULES}: {name}: keep expr on one line");
            alerts.push((name.to_string(), expr.trim_matches(|c| c == '"' || c == '\'').to_string()));
        }
    }
    assert!(alerts.len() >= 5, "{RULES}: found only {alerts:?}");
    alerts
}

/// The alerts that fire on `store`, with the instances (or jobs) each fires for.
fn firing(store: &promql::Store) -> BTreeMap<String, Vec<String>> {
    let mut fired = BTreeMap::new();
    for (name, expr) in alerts() {
        let result = promql::eval(&expr, store);
        if !result.is_empty() {
            let who = result
                .iter()
                .map(|(labels, value)| {
                    let target = labels.get("instance").or(labels.get("job")).cloned().unwrap_or_default();
                    format!("{target} = {value}")
                })
                .collect();
            fired.insert(name, who);
        }
    }
    fired
}

/// The evaluator on pages written by hand (selectors, filters, aggregation, set operators, increase), and
/// every shipped rule parses.
#[test]
fn the_evaluator_follows_promql_on_known_pages() {
    let mut store = promql::Store::default();
    store.add_target("j", "a", &["x 1\nc_total{kind=\"k\"} 1\n".into(), "x 1\nc_total{kind=\"k\"} 4\n".into()]);
    store.add_target("j", "b", &["x 0\nc_total{kind=\"k\"} 2\n".into(), "x 0\nc_total{kind=\"k\"} 2\n".into()]);
    let instances = |expr: &str| -> Vec<String> {
        promql::eval(expr, &store)
            .into_iter()
            .map(|(l, v)| format!("{}={v}", l.get("instance").map_or("-", |s| s)))
            .collect()
    };
    assert_eq!(instances("x == 0"), ["b=0"]);
    assert_eq!(instances("x == 0 and x == 1"), Vec::<String>::new());
    assert_eq!(instances("x >= 0 unless x == 1"), ["b=0"]);
    assert_eq!(instances("x == 0 or x == 1"), ["b=0", "a=1"]);
    assert_eq!(instances("increase(c_total{kind=\"k\"}[10m]) > 0"), ["a=3"]);
    assert_eq!(instances("up{job=\"j\"} == 1"), ["a=1", "b=1"]);
    assert_eq!(instances("sum by (job) (x) == 1"), ["-=1"]);
    assert_eq!(instances("sum by (job) (x) == 1 and sum by (job) (up) > 1"), ["-=1"]);
    assert_eq!(instances("(x{instance!=\"a\"})"), ["b=0"]);
    // Every shipped rule is within the subset (a parse error panics), and nothing fires without series.
    assert!(firing(&promql::Store::default()).is_empty());
}

/// A running connector's scrapes, taken a second apart, for the evaluator.
fn scrapes(port: u16) -> Vec<String> {
    (0..2)
        .map(|i| {
            if i > 0 {
                std::thread::sleep(Duration::from_secs(1));
            }
            common::scrape(port).expect("/metrics answered before")
        })
        .collect()
}

/// The value of the unlabelled series `name` on a page.
fn gauge(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.split_whitespace().next()?.parse().ok())
}

/// Guards against alerts that page for a healthy active/standby pair: `OutboxCdcNotReady` was
/// `outbox_cdc_ready == 0`, which a standby (not ready by design: it waits for the lease) satisfies for
/// ever. Two real instances with the Kafka state backend and `exactly_once`: on their pages no alert fires;
/// on the standby's alone (no instance holds the lease) exactly `OutboxCdcNoActiveInstance` does. Every
/// metric the dashboard and the rules query is on these pages too (the exactly-once series included).
#[tokio::test(flavor = "multi_thread")]
async fn alerts_are_quiet_for_an_active_and_a_standby_and_see_no_active_instance() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Noida);
    let mut conn = db.conn().await;
    for i in 0..3 {
        insert_event(&mut conn, &OutboxRow::new(format!("A-{i}"))).await.unwrap();
    }
    let settings = |port: u16| {
        format!(
            "[delivery]\nguarantee = \"exactly_once\"\nfailover_timeout_ms = 3000\n[state]\nbackend = \"kafka\"\n\
             checkpoint_interval_ms = 200\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"
        )
    };
    let (active_port, standby_port) = (free_port(), free_port());
    let active = Connector::start(&db, &broker, &settings(active_port));
    let mut page = None;
    assert!(
        wait_until(Duration::from_secs(120), || {
            page = common::scrape(active_port);
            page.as_deref().is_some_and(|p| {
                gauge(p, "outbox_cdc_lease_held") == Some(1.0)
                    && gauge(p, "outbox_cdc_ready") == Some(1.0)
                    && p.contains("outbox_cdc_kafka_transactions_total{outcome=\"committed\"}")
                    && p.contains("outbox_cdc_end_to_end_latency_seconds_count{")
            })
        }),
        "the first instance never became an active that committed the events: {page:?}\n{}",
        active.logs()
    );
    let standby = Connector::start(&db, &broker, &settings(standby_port));
    assert!(
        wait_until(Duration::from_secs(60), || {
            page = common::scrape(standby_port);
            page.as_deref().is_some_and(|p| gauge(p, "outbox_cdc_standby") == Some(1.0))
        }),
        "the second instance never reported itself a standby: {page:?}\n{}",
        standby.logs()
    );
    let (active_pages, standby_pages) = (scrapes(active_port), scrapes(standby_port));
    for (who, pages) in [("active", &active_pages), ("standby", &standby_pages)] {
        let last = pages.last().expect("two scrapes");
        let expected = if who == "active" { [1.0, 1.0, 0.0] } else { [0.0, 0.0, 1.0] };
        let seen = ["outbox_cdc_ready", "outbox_cdc_lease_held", "outbox_cdc_standby"].map(|n| gauge(last, n));
        assert_eq!(seen, expected.map(Some), "{who}: ready, lease_held, standby on\n{last}");
    }

    let exposed = exposed_series(active_pages.last().expect("two scrapes"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in QUERYING_FILES {
        let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("read {file}: {e}"));
        let missing: Vec<_> = referenced_metrics(&text).into_iter().filter(|m| !exposed.contains(m)).collect();
        assert!(missing.is_empty(), "{file} queries metrics the active's /metrics does not expose: {missing:?}");
    }

    let job = "outbox-cdc";
    let (active_at, standby_at) = (format!("127.0.0.1:{active_port}"), format!("127.0.0.1:{standby_port}"));
    let mut pair = promql::Store::default();
    pair.add_target(job, &active_at, &active_pages);
    pair.add_target(job, &standby_at, &standby_pages);
    let fired = firing(&pair);
    assert!(fired.is_empty(), "alerts fire for a healthy active and standby: {fired:?}");

    let mut active_alone = promql::Store::default();
    active_alone.add_target(job, &active_at, &active_pages);
    let fired = firing(&active_alone);
    assert!(fired.is_empty(), "alerts fire for a healthy active alone: {fired:?}");

    let mut standby_alone = promql::Store::default();
    standby_alone.add_target(job, &standby_at, &standby_pages);
    let fired = firing(&standby_alone);
    assert_eq!(
        fired.keys().collect::<Vec<_>>(),
        ["OutboxCdcNoActiveInstance"],
        "a standby with no active instance: {fired:?}"
    );
}

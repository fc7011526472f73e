//! Where a run starts: the stored checkpoint, a snapshot (new or resumed), or a fresh start point. Decided
//! before anything of the run is built, and returned as a value ([`Plan`]) that the wiring in
//! [`super::Pipeline`] carries out.
//!
//! Floor 5 (docs/ARCHITECTURE.md): imports floors 0-4.
//!
//! The decision itself is pure ([`decide`], table-tested below); [`server`] and [`files()`] gather what it
//! needs: the stored checkpoint, the checks that it may be resumed on this server or these files, and the
//! preflight report, which refuses a server the stream cannot read before anything is produced.

use std::path::PathBuf;

use crate::checkpoint::checkpointer::Checkpointer;
use crate::checkpoint::{Checkpoint, Mark, Store};
use crate::config::{Config, FilesSource, ServerSource, SnapshotMode};
use crate::error::{Error, Result};
use crate::outbox::TableName;
use crate::position::snapshot::SnapshotState;
use crate::position::{Flavor, Gtids, Position, ServerIdentity};
use crate::source::files::{self, Scan};
use crate::source::{preflight, server_info, start_position, ServerInfo, SourceConn};

/// What a run does first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Plan {
    /// Scan outbox tables (from the start, or resuming after the stored progress), then stream: from the
    /// snapshot's cut, or for tables added later from the checkpoint ([`SnapshotPlan`]).
    Snapshot(Box<SnapshotPlan>),
    /// Stream from the stored checkpoint (with a finished snapshot's overlap rule while it is in force).
    Resume(Mark),
    /// No checkpoint and no snapshot: stream from a start point, stored before anything is produced so that
    /// a crash before the first acknowledgement resumes there, not at a later "current" position that would
    /// skip what was committed meanwhile.
    Fresh(Position),
}

impl Plan {
    /// What the run does first, once its start point is durable: a fresh one is stored before anything is
    /// produced (see [`Plan::Fresh`]); a checkpoint or a snapshot's progress already is.
    ///
    /// Called once the run's producer started, never before: with `exactly_once` that start fenced every
    /// older producer of the connector's id and read the state on to its end (`Commit::start`), which fails
    /// when a checkpoint appeared since the plan was made. Written before that, a fresh start point would
    /// be the newest checkpoint record on the state topic and hide one that another instance (a split
    /// brain) committed in between: the catch-up compares the newest record only, and would see nothing
    /// moved.
    ///
    /// # Errors
    /// A definite error when the start point cannot be stored.
    pub(super) fn first(self, checkpointer: &Checkpointer) -> Result<First> {
        match self {
            Plan::Snapshot(snapshot) => Ok(First::Snapshot(snapshot)),
            Plan::Resume(mark) => Ok(First::Stream(mark)),
            Plan::Fresh(position) => {
                let mark = Mark::boundary(position, None);
                checkpointer.save_now(mark.clone())?;
                Ok(First::Stream(mark))
            }
        }
    }
}

/// What a run does first, from a durable start point.
#[derive(Debug)]
pub(super) enum First {
    /// Scan outbox tables, then stream.
    Snapshot(Box<SnapshotPlan>),
    /// Stream from this mark.
    Stream(Mark),
}

/// A snapshot to take before the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SnapshotPlan {
    /// The tables to scan, in order.
    pub tables: Vec<TableName>,
    /// The stored progress to resume after, if any.
    pub progress: Option<SnapshotState>,
    /// Tables added to a connector that streamed already: the checkpoint its stream resumes from (before the
    /// cut; the overlap rule skips the rows the snapshot read). `None` for the initial snapshot, whose stream
    /// starts at its cut.
    pub added_at: Option<Mark>,
}

/// What [`decide`] chose, before a fresh start point is looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Decision {
    /// See [`Plan::Snapshot`].
    Snapshot(Box<SnapshotPlan>),
    /// See [`Plan::Resume`].
    Resume(Mark),
    /// See [`Plan::Fresh`]: the start point is the source's to say.
    Fresh,
}

/// Where to start, from the stored checkpoint (`None`: none, or one that may not be resumed and is to be
/// replaced by a new snapshot), `snapshot.mode` and the `configured` tables.
///
/// A checkpoint whose run published fewer tables than are configured now has the new ones snapshotted
/// first, unless `snapshot.mode` is `never` (then they are streamed from the checkpoint on) or
/// `initial_only` (which only ever takes the first snapshot). A checkpoint of an earlier version names no
/// tables: it is taken to cover the configured ones.
pub(super) fn decide(stored: Option<Checkpoint>, mode: SnapshotMode, configured: &[TableName]) -> Decision {
    let initial = |progress: Option<SnapshotState>| {
        let tables = progress.as_ref().map_or_else(|| configured.to_vec(), |p| p.tables_or(configured.to_vec()));
        Decision::Snapshot(Box::new(SnapshotPlan { tables, progress, added_at: None }))
    };
    match stored {
        Some(cp) => match cp.snapshot() {
            Some(state) if !state.done && state.added => {
                let progress = Some(state.clone());
                let tables = state.tables.iter().filter_map(|t| TableName::parse(t).ok()).collect();
                Decision::Snapshot(Box::new(SnapshotPlan { tables, progress, added_at: Some(cp.into_mark()) }))
            }
            Some(state) if !state.done => initial(Some(state.clone())),
            _ => {
                let covered = cp.tables();
                let added: Vec<TableName> = configured
                    .iter()
                    .filter(|t| !covered.is_empty() && !covered.contains(&t.to_string()))
                    .cloned()
                    .collect();
                let snapshots = matches!(mode, SnapshotMode::Initial | SnapshotMode::WhenNeeded);
                match added.is_empty() || !snapshots {
                    true => Decision::Resume(cp.into_mark()),
                    false => Decision::Snapshot(Box::new(SnapshotPlan {
                        tables: added,
                        progress: None,
                        added_at: Some(cp.into_mark()),
                    })),
                }
            }
        },
        None if mode == SnapshotMode::Never => Decision::Fresh,
        None => initial(None),
    }
}

/// A run against a live server: who it is, and the plan.
pub(super) struct ServerPlan {
    /// What the connector learned about the server.
    pub info: ServerInfo,
    /// What the run does first.
    pub plan: Plan,
}

/// Connects, checks that the stored checkpoint may be resumed here (or, with `snapshot.mode =
/// "when_needed"`, decides to snapshot again when it may not), runs preflight, and decides.
///
/// # Errors
/// Connection errors (transient), a failed preflight or an unresumable checkpoint (definite).
pub(super) async fn server(
    source: &SourceConn,
    server: &ServerSource,
    config: &Config,
    store: &Store,
    accept_new_server: bool,
) -> Result<ServerPlan> {
    let mut conn = source.connect().await?;
    let info = server_info(&mut conn).await?;
    let stored = store.load()?;
    let mut checked = None;
    if let (Some(cp), Some(_)) = (&stored, &server.start_after) {
        tracing::warn!(position = %cp.position(), "source.start_after is ignored: resuming from the checkpoint");
    }
    if let Some(cp) = &stored {
        if *cp.server() != info.identity && accept_new_server {
            tracing::warn!(
                checkpoint_server = %preflight::describe_identity(cp.server()),
                server = %preflight::describe_identity(&info.identity),
                "resuming a checkpoint of another server (--accept-new-server)"
            );
        }
        let resume = preflight::Resume {
            server: if accept_new_server { &info.identity } else { cp.server() },
            position: cp.position(),
            // Another server's files are its own: nothing there to compare the checkpoint's last event with.
            end_event: cp.end_event().filter(|_| *cp.server() == info.identity),
        };
        checked = Some(preflight::ResumeCheck::run(source, &mut conn, &info, server.server_id, resume).await?);
    }
    let mut snapshot_again = false;
    if let (Some(checked), SnapshotMode::WhenNeeded) = (&checked, config.snapshot.mode) {
        if let Some(e) = checked.unresumable()? {
            tracing::error!(
                error = %e,
                "the checkpoint cannot be resumed on this server; taking a new snapshot \
                 (snapshot.mode = \"when_needed\"). Events committed since the checkpoint are recovered \
                 from the table; rows already deleted from it are not"
            );
            snapshot_again = true;
        }
    }
    let checked = checked.filter(|_| !snapshot_again);
    let report = preflight::check(&mut conn, &info, config, checked.as_ref()).await?;
    for finding in report.findings.iter().filter(|f| f.status == crate::findings::Status::Warn) {
        tracing::warn!(setting = %finding.setting, actual = %finding.actual, fix = %finding.fix, "preflight warning");
    }
    report.into_result()?;
    let stored = stored.filter(|_| !snapshot_again);
    let plan = match decide(stored, config.snapshot.mode, config.tables()) {
        Decision::Snapshot(snapshot) => {
            if let (Some(mark), None) = (&snapshot.added_at, &snapshot.progress) {
                let tables: Vec<String> = snapshot.tables.iter().map(ToString::to_string).collect();
                tracing::info!(
                    tables = %tables.join(", "),
                    position = %mark.position,
                    "tables added to [outbox] since the checkpoint: snapshotting them before the stream resumes"
                );
            }
            Plan::Snapshot(snapshot)
        }
        Decision::Resume(mark) => Plan::Resume(mark),
        Decision::Fresh => {
            let position = start_position(&mut conn, &info, server).await?;
            tracing::info!(%position, start_from = ?server.start_from, "no checkpoint: starting fresh");
            Plan::Fresh(position)
        }
    };
    Ok(ServerPlan { info, plan })
}

/// A run over binlog files (`source.kind = "files"`): which files, who wrote them, and the plan.
pub(super) struct FilesPlan {
    /// The files, in order.
    pub paths: Vec<PathBuf>,
    /// What the first file says about its server.
    pub first: Scan,
    /// Who wrote the files.
    pub identity: ServerIdentity,
    /// [`Plan::Resume`] or [`Plan::Fresh`]: there is no snapshot of files.
    pub plan: Plan,
}

/// Reads the files' headers and decides where to start: the checkpoint, if it belongs to these files, or the
/// first file's GTID state plus `source.start_after`.
///
/// # Errors
/// Definite errors for unreadable files and for a checkpoint these files cannot resume.
pub(super) fn files(source: &FilesSource, store: &Store, accept_new_server: bool) -> Result<FilesPlan> {
    let (paths, first) = files::inspect(source)?;
    let identity = files::identity(&first.header);
    let stored = store.load()?;
    if let Some(cp) = &stored {
        resumable_by_files(cp, &identity, first.header.flavor, accept_new_server)?;
        if source.start_after.is_some() {
            tracing::warn!(position = %cp.position(), "source.start_after is ignored: resuming from the checkpoint");
        }
    }
    let plan = match decide(stored, SnapshotMode::Never, &[]) {
        Decision::Resume(mark) => Plan::Resume(Mark { snapshot: None, ..mark }),
        Decision::Snapshot(_) => unreachable!("a checkpoint with an unfinished snapshot was refused above"),
        Decision::Fresh => {
            let position = files::start_position(&paths[0], &first.header, source.start_after.as_deref())?;
            tracing::info!(%position, "no checkpoint: publishing what the binlog files hold after this position");
            Plan::Fresh(position)
        }
    };
    Ok(FilesPlan { paths, first, identity, plan })
}

/// Refuses a checkpoint of another source (unless accepted), of another GTID kind, or with an unfinished
/// snapshot.
fn resumable_by_files(
    cp: &Checkpoint,
    identity: &ServerIdentity,
    flavor: Flavor,
    accept_new_server: bool,
) -> Result<()> {
    if cp.server() != identity {
        if !accept_new_server {
            return Err(Error::definite(format!(
                "the checkpoint belongs to {}, but the binlog files were written by {}; restart with \
                 --accept-new-server to continue from the checkpoint's position anyway, or move the \
                 state directory away to start afresh",
                preflight::describe_identity(cp.server()),
                preflight::describe_identity(identity)
            )));
        }
        tracing::warn!(
            checkpoint_server = %preflight::describe_identity(cp.server()),
            files = %preflight::describe_identity(identity),
            "resuming a checkpoint of another source (--accept-new-server)"
        );
    }
    let matches = matches!(
        (&cp.position().gtids, flavor),
        (Gtids::MySql(_), Flavor::MySql) | (Gtids::MariaDb(_), Flavor::MariaDb) | (Gtids::None, _)
    );
    if !matches || cp.snapshot().is_some_and(|s| !s.done) {
        return Err(Error::definite(format!(
            "the checkpoint at {} cannot resume a run over {:?} binlog files (other GTID kind, or an \
             unfinished snapshot); move the state directory away",
            cp.position(),
            flavor
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::snapshot::Segment;
    use crate::position::BinlogCoord;

    fn position(gtids: &str) -> Position {
        Position {
            gtids: Gtids::MariaDb(gtids.parse().unwrap()),
            coord: BinlogCoord { file: "b.000001".into(), pos: 4 },
        }
    }

    fn snapshot(done: bool) -> SnapshotState {
        SnapshotState {
            added: false,
            segments: vec![Segment { view: position("0-1-5"), after: None }],
            last_key: None,
            rows_done: 3,
            rows_estimate: 10,
            done,
            tables: vec!["shop.outbox_events".into()],
        }
    }

    fn stored(snapshot: Option<SnapshotState>) -> Option<Checkpoint> {
        let server = ServerIdentity { flavor: Flavor::MariaDb, server_id: 1, server_uuid: None, binlog_files: false };
        Some(Checkpoint::for_test(position("0-1-5"), server, snapshot))
    }

    fn tables(names: &[&str]) -> Vec<TableName> {
        names.iter().map(|t| TableName::parse(t).unwrap()).collect()
    }

    /// One row per rule: a checkpoint is resumed unless its snapshot is unfinished (which resumes the
    /// snapshot) or tables were configured since it was written (which are snapshotted first, from it);
    /// without one, `snapshot.mode` decides between a new snapshot and a fresh start point.
    #[test]
    fn a_run_starts_where_the_checkpoint_and_snapshot_mode_say() {
        use SnapshotMode::*;
        let one = tables(&["shop.outbox_events"]);
        let two = tables(&["shop.outbox_events", "shop.outbox_payments"]);
        let resume = |snapshot: Option<SnapshotState>| Decision::Resume(stored(snapshot).unwrap().into_mark());
        let initial = |progress: Option<SnapshotState>| {
            Decision::Snapshot(Box::new(SnapshotPlan { tables: one.clone(), progress, added_at: None }))
        };
        let covering_one = || stored(None).map(|c| c.covering(&["shop.outbox_events"]));
        let added_at = covering_one().unwrap().into_mark();
        let added = Decision::Snapshot(Box::new(SnapshotPlan {
            tables: tables(&["shop.outbox_payments"]),
            progress: None,
            added_at: Some(added_at.clone()),
        }));
        let unfinished_added =
            SnapshotState { added: true, tables: vec!["shop.outbox_payments".into()], ..snapshot(false) };
        let resumed_added = Decision::Snapshot(Box::new(SnapshotPlan {
            tables: tables(&["shop.outbox_payments"]),
            progress: Some(unfinished_added.clone()),
            added_at: Some(stored(Some(unfinished_added.clone())).unwrap().into_mark()),
        }));
        let cases = [
            (stored(None), Initial, &one, resume(None), "a checkpoint"),
            (stored(None), Never, &one, resume(None), "a checkpoint, never"),
            (stored(Some(snapshot(true))), Initial, &one, resume(Some(snapshot(true))), "a finished snapshot"),
            (stored(Some(snapshot(false))), Initial, &one, initial(Some(snapshot(false))), "an unfinished one"),
            (stored(Some(snapshot(false))), Never, &one, initial(Some(snapshot(false))), "an unfinished one, never"),
            (None, Initial, &one, initial(None), "nothing"),
            (None, InitialOnly, &one, initial(None), "nothing, initial_only"),
            (None, WhenNeeded, &one, initial(None), "nothing, when_needed"),
            (None, Never, &one, Decision::Fresh, "nothing, never"),
            (covering_one(), Initial, &two, added.clone(), "a table added"),
            (covering_one(), WhenNeeded, &two, added, "a table added, when_needed"),
            (covering_one(), Never, &two, Decision::Resume(added_at.clone()), "a table added, never"),
            (covering_one(), InitialOnly, &two, Decision::Resume(added_at), "a table added, initial_only"),
            (stored(None), Initial, &two, resume(None), "a checkpoint of an earlier version covers them all"),
            (covering_one(), Initial, &one, Decision::Resume(covering_one().unwrap().into_mark()), "as configured"),
            (stored(Some(unfinished_added)), Initial, &two, resumed_added, "an unfinished added-table snapshot"),
        ];
        for (stored, mode, configured, expected, what) in cases {
            assert_eq!(decide(stored, mode, configured), expected, "{what}");
        }
    }
}

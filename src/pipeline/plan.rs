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
use crate::position::snapshot::SnapshotState;
use crate::position::{Flavor, Gtids, Position, ServerIdentity};
use crate::source::files::{self, Scan};
use crate::source::{preflight, server_info, start_position, ServerInfo, SourceConn};

/// What a run does first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Plan {
    /// Scan the outbox tables (from the start, or resuming after the stored progress), then stream from the
    /// snapshot's cut.
    Snapshot(Option<SnapshotState>),
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
            Plan::Snapshot(progress) => Ok(First::Snapshot(progress)),
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
    /// Scan the outbox tables, then stream from the snapshot's cut.
    Snapshot(Option<SnapshotState>),
    /// Stream from this mark.
    Stream(Mark),
}

/// What [`decide`] chose, before a fresh start point is looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Decision {
    /// See [`Plan::Snapshot`].
    Snapshot(Option<SnapshotState>),
    /// See [`Plan::Resume`].
    Resume(Mark),
    /// See [`Plan::Fresh`]: the start point is the source's to say.
    Fresh,
}

/// Where to start, from the stored checkpoint (`None`: none, or one that may not be resumed and is to be
/// replaced by a new snapshot) and `snapshot.mode`.
pub(super) fn decide(stored: Option<Checkpoint>, mode: SnapshotMode) -> Decision {
    match stored {
        Some(cp) => match cp.snapshot() {
            Some(state) if !state.done => Decision::Snapshot(Some(state.clone())),
            _ => Decision::Resume(cp.into_mark()),
        },
        None if mode == SnapshotMode::Never => Decision::Fresh,
        None => Decision::Snapshot(None),
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
        checked = Some(preflight::ResumeCheck::run(&mut conn, &info, server.server_id, resume).await?);
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
    let plan = match decide(stored, config.snapshot.mode) {
        Decision::Snapshot(progress) => Plan::Snapshot(progress),
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
    let plan = match decide(stored, SnapshotMode::Never) {
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

    /// One row per rule: a checkpoint is resumed unless its snapshot is unfinished (which resumes the
    /// snapshot); without one, `snapshot.mode` decides between a new snapshot and a fresh start point.
    #[test]
    fn a_run_starts_where_the_checkpoint_and_snapshot_mode_say() {
        use SnapshotMode::*;
        let resume = |snapshot: Option<SnapshotState>| Decision::Resume(stored(snapshot).unwrap().into_mark());
        let cases = [
            (stored(None), Initial, resume(None)),
            (stored(None), Never, resume(None)),
            (stored(Some(snapshot(true))), Initial, resume(Some(snapshot(true)))),
            (stored(Some(snapshot(false))), Initial, Decision::Snapshot(Some(snapshot(false)))),
            (stored(Some(snapshot(false))), Never, Decision::Snapshot(Some(snapshot(false)))),
            (None, Initial, Decision::Snapshot(None)),
            (None, InitialOnly, Decision::Snapshot(None)),
            (None, WhenNeeded, Decision::Snapshot(None)),
            (None, Never, Decision::Fresh),
        ];
        for (stored, mode, expected) in cases {
            let name = format!("{:?} with {mode:?}", stored.as_ref().map(|c| c.snapshot().map(|s| s.done)));
            assert_eq!(decide(stored, mode), expected, "{name}");
        }
    }
}

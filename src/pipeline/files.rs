//! A run over binlog files (`source.kind = "files"`): the stream phase of [`Pipeline::run`] with a
//! [`FilesReader`] instead of a replication connection, and an end — once the last file is consumed, the run
//! waits for every acknowledgement, writes the checkpoint and returns `Ok`, so the process exits 0.
//!
//! No snapshot (there is no table), no server to ask: the start point is the checkpoint, or the first file's
//! PREVIOUS_GTIDS / GTID_LIST plus `source.start_after` (see [`crate::source::files`]).

use std::sync::Arc;

use super::{Checkpointer, Pipeline, ReadAhead, Shutdown, StreamState};
use crate::checkpoint::{Mark, Watermark};
use crate::error::{Error, Result};
use crate::health::health;
use crate::position::{Flavor, Gtids};
use crate::publish::Publisher;
use crate::sink::KafkaSink;
use crate::source::files::{self, FilesReader};
use crate::source::{preflight, SourceReader};

impl Pipeline {
    /// Publishes what the configured binlog files hold after the resume point, then returns.
    pub(super) async fn run_files(&self, shutdown: &Shutdown) -> Result<()> {
        let config = &self.config;
        let (paths, first) = files::inspect(config)?;
        let identity = files::identity(&first.header);
        let checkpointer = Checkpointer::new(self.store.clone(), identity.clone());
        let start = match self.store.load()? {
            Some(cp) => {
                if *cp.server() != identity {
                    if !self.accept_new_server {
                        return Err(Error::definite(format!(
                            "the checkpoint belongs to {}, but the binlog files were written by {}; restart with \
                             --accept-new-server to continue from the checkpoint's position anyway, or move the \
                             state directory away to start afresh",
                            preflight::describe_identity(&cp.server()),
                            preflight::describe_identity(&identity)
                        )));
                    }
                    tracing::warn!(
                        checkpoint_server = %preflight::describe_identity(&cp.server()),
                        files = %preflight::describe_identity(&identity),
                        "resuming a checkpoint of another source (--accept-new-server)"
                    );
                }
                let matches = matches!(
                    (&cp.position().gtids, first.header.flavor),
                    (Gtids::MySql(_), Flavor::MySql) | (Gtids::MariaDb(_), Flavor::MariaDb) | (Gtids::None, _)
                );
                if !matches || cp.snapshot().as_ref().is_some_and(|s| !s.done) {
                    return Err(Error::definite(format!(
                        "the checkpoint at {} cannot resume a run over {:?} binlog files (other GTID kind, or an \
                         unfinished snapshot); move the state directory away",
                        cp.position(),
                        first.header.flavor
                    )));
                }
                if config.source.start_after.is_some() {
                    tracing::warn!(position = %cp.position(), "source.start_after is ignored: resuming from the checkpoint");
                }
                Mark { snapshot: None, ..cp.into_mark() }
            }
            None => {
                let position = files::start_position(&paths[0], &first.header, config.source.start_after.as_deref())?;
                tracing::info!(%position, "no checkpoint: publishing what the binlog files hold after this position");
                let mark = Mark::boundary(position, None);
                checkpointer.save_now(mark.clone())?;
                mark
            }
        };

        let watermark = Arc::new(Watermark::new(None));
        let mut sink = KafkaSink::new(&config.kafka, watermark.clone())?;
        let mut publisher = Publisher::new(config, self.router.clone(), self.store.clone())?;
        watermark.reset(start.clone());
        checkpointer.already_saved(start.clone());
        let mut periodic = checkpointer.every(watermark.clone(), self.checkpoint_interval());
        tracing::info!(
            position = %start.position,
            files = paths.len(),
            source = %preflight::describe_identity(&identity),
            version = %first.header.server_version,
            "reading binlog files"
        );
        publisher.resume(crate::poison::ResumePoint::Stream(&start.position));
        let reader = SourceReader::Files(FilesReader::start(paths, self.reader.clone(), start.position)?);
        let mut reader = ReadAhead::spawn(reader, config.source.read_ahead_bytes);
        health().set_source_connected(true);
        let mut stream = StreamState { current: None, start: None, overlap: None, row_index: 0 };
        let result =
            self.stream(&mut reader, &mut sink, &mut publisher, &watermark, &mut periodic, &mut stream, shutdown).await;
        drop(reader);
        if let Some(tx) = stream.current.take() {
            watermark.abandon(tx);
        }
        self.settle(result, &sink, &watermark, &checkpointer).await?;
        if watermark.unsettled() > 0 {
            // Exit 0 must mean "everything in the files is in Kafka": resume from the checkpoint instead.
            return Err(Error::transient("records of the binlog files were not acknowledged in time; resuming"));
        }
        if shutdown.requested_at().is_none() {
            tracing::info!("binlog files published and checkpointed: done");
        }
        Ok(())
    }
}

//! The offline source: binlog files on disk instead of a replication connection (`[source] kind = "files"`),
//! for forensics and disaster recovery ("the server is gone, we kept its binlogs: publish what is in them
//! after GTID X"). Events go through the same [`ChangeDecoder`] as the live stream, so routing, delivery and
//! checkpointing are the live ones.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! # Order and start point
//! Files are read in binlog index order: by name, the numeric suffix compared as a number
//! (`mysql-bin.999999` before `mysql-bin.1000000`). The resume point is the checkpoint or, without one, the
//! first file's PREVIOUS_GTIDS (MySQL) / GTID_LIST (MariaDB) plus `source.start_after`. Transactions the
//! resume point already holds are read but not published — the rule a server applies to
//! COM_BINLOG_DUMP_GTID — so a resumed run publishes nothing twice beyond the usual at-least-once window.
//! Without GTIDs (MySQL with `gtid_mode=OFF`, 5.5) the resume point is a file and offset: earlier files are
//! not opened, earlier transactions in that file are skipped.
//!
//! # Invariants
//! * No file is skipped: each file must continue what was read before it (or the resume position) — its
//!   PREVIOUS_GTIDS / GTID_LIST is contained in the position, and it is the file the previous one's ROTATE
//!   named. A gap is a definite error, never a silent jump.
//! * A transaction is published only if the file holds it whole. Before a file is read, a pre-scan (the
//!   same decoder, no outbox tables, so no row decoding) finds the end of its last complete transaction
//!   and checks every event's CRC32. In the last file, bytes after that end (a file still being written,
//!   or torn by a crash — such a transaction never committed) are reported and not read. In any earlier
//!   file they are corruption: a definite error before anything of that file is published.
//! * The run ends when the last file is consumed: the pipeline waits for every acknowledgement, writes the
//!   checkpoint and exits 0.
//!
//! # Error handling
//! Everything here is definite: a file that is not a binlog, a checksum mismatch, an encrypted binlog, a
//! truncated non-last file, an unsupported event. Retrying cannot change a file.
//!
//! # Why read the files ourselves
//! mysql_common's `BinlogFile` iterator ends silently at a torn event and its `Event::read` panics on a
//! short read; [`super::binlog::read_event_bytes`] reads whole events and reports truncation instead.
//! Reads are blocking: the files are local and each `next()` reads at most one event before yielding a
//! change, which is short enough for the runtime.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use mysql_common::binlog::consts::{BinlogChecksumAlg, BinlogVersion};
use mysql_common::binlog::events::{Event, EventData, FormatDescriptionEvent};

use super::binlog::{parse_event, read_event_bytes, Change, ChangeDecoder, ReaderSettings, FORMAT_DESCRIPTION};
use crate::config::{Binlogs, FilesSource};
use crate::error::{Error, Result};
use crate::position::mariadb::{GtidPos, MariaGtid};
use crate::position::mysql::{GtidSet, Tag, Uuid};
use crate::position::ServerIdentity;
use crate::position::{BinlogCoord, Flavor, Gtids, Position};

/// The 4 bytes every binlog file starts with.
const MAGIC: [u8; 4] = [0xfe, b'b', b'i', b'n'];
/// MariaDB's START_ENCRYPTION event: the rest of the file is encrypted.
const MARIADB_START_ENCRYPTION: u8 = 164;
const MARIADB_GTID_LIST: u8 = 163;
const MARIADB_GTID: u8 = 162;
const MYSQL_GTID: u8 = 33;
const MYSQL_PREVIOUS_GTIDS: u8 = 35;
const MYSQL_GTID_TAGGED: u8 = 42;

/// What the beginning of a binlog file says about the server that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHeader {
    /// Server version from FORMAT_DESCRIPTION.
    pub server_version: String,
    /// MySQL or MariaDB.
    pub flavor: Flavor,
    /// `server_id` of the server that wrote the file (FORMAT_DESCRIPTION's header).
    pub server_id: u32,
    /// GTIDs written before this file: PREVIOUS_GTIDS (MySQL), GTID_LIST (MariaDB); `None` before MySQL 5.6.
    pub previous: Gtids,
    /// The file holds GTID events (not only anonymous ones).
    pub has_gtids: bool,
}

/// The result of a pre-scan: the header, and where the file's last complete transaction ends.
#[derive(Debug, Clone)]
pub struct Scan {
    /// The file's header.
    pub header: FileHeader,
    /// Byte offset just after the last event that leaves no transaction open.
    pub complete_end: u64,
    /// File size in bytes.
    pub len: u64,
    /// Why the file does not end at `complete_end`, if it does not.
    pub tail: Option<String>,
}

/// Binlog files named by the config, in binlog index order.
///
/// # Errors
/// A definite error when the directory or a file cannot be read, or a file is not a binlog.
pub fn list_files(source: &FilesSource) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = match &source.binlogs {
        Binlogs::Dir(dir) => {
            let entries = std::fs::read_dir(dir)
                .map_err(|e| Error::definite(format!("source.binlog_dir {}: {e}", dir.display())))?;
            let mut files = Vec::new();
            for entry in entries {
                let path = entry.map_err(|e| Error::definite(format!("reading {}: {e}", dir.display())))?.path();
                // Index files, relay-log info and anything else that is not a binlog are not ours.
                if path.is_file() && starts_with_magic(&path) {
                    files.push(path);
                }
            }
            if files.is_empty() {
                return Err(Error::definite(format!("source.binlog_dir {} holds no binlog files", dir.display())));
            }
            files
        }
        Binlogs::Files(files) => files.clone(),
    };
    for path in &files {
        if !starts_with_magic(path) {
            return Err(Error::definite(format!(
                "{} is not a binlog file (it does not start with the bytes FE 62 69 6E) or cannot be read",
                path.display()
            )));
        }
    }
    files.sort_by_key(|f| index_order(f));
    Ok(files)
}

/// Sort key in binlog index order: base name, then the numeric suffix as a number.
fn index_order(path: &Path) -> (String, u64, String) {
    let name = file_name(path);
    match name.rsplit_once('.') {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            (base.to_string(), n.parse().unwrap_or(u64::MAX), name)
        }
        _ => (name.clone(), 0, name),
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn starts_with_magic(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && magic == MAGIC
}

/// One binlog file being read event by event.
struct EventFile {
    path: PathBuf,
    input: BufReader<File>,
    fde: FormatDescriptionEvent<'static>,
    /// Events carry a CRC32 trailer.
    checksum: bool,
    /// Byte offset of the next event.
    offset: u64,
}

impl EventFile {
    fn open(path: &Path) -> Result<Self> {
        let mut input = BufReader::with_capacity(
            256 * 1024,
            File::open(path).map_err(|e| Error::definite(format!("cannot open {}: {e}", path.display())))?,
        );
        let mut magic = [0u8; 4];
        input
            .read_exact(&mut magic)
            .ok()
            .filter(|_| magic == MAGIC)
            .ok_or_else(|| Error::definite(format!("{} is not a binlog file", path.display())))?;
        Ok(EventFile {
            path: path.to_path_buf(),
            input,
            fde: FormatDescriptionEvent::new(BinlogVersion::Version4),
            checksum: false,
            offset: 4,
        })
    }

    /// The next whole event, checksum verified; `None` at the end of the file.
    fn next(&mut self) -> std::result::Result<Option<Event>, EventFileError> {
        let Some(bytes) = read_event_bytes(&mut self.input, self.checksum).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                EventFileError::Truncated(e.to_string())
            } else {
                EventFileError::Bad(e.to_string())
            }
        })?
        else {
            return Ok(None);
        };
        let is_fde = bytes[4] == FORMAT_DESCRIPTION;
        let event = parse_event(&self.fde, &bytes).map_err(|e| EventFileError::Bad(e.to_string()))?;
        if is_fde {
            let fde = match event.read_data() {
                Ok(Some(EventData::FormatDescriptionEvent(fde))) => fde.into_owned(),
                other => return Err(EventFileError::Bad(format!("unreadable FORMAT_DESCRIPTION: {other:?}"))),
            };
            self.checksum =
                matches!(fde.footer().get_checksum_alg(), Ok(Some(BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_CRC32)));
            self.fde = fde;
        }
        if self.checksum || is_fde {
            if let (Some(stored), Ok(Some(alg))) = (event.checksum(), event.footer().get_checksum_alg()) {
                if alg == BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_CRC32
                    && event.calc_checksum(alg) != u32::from_le_bytes(stored)
                {
                    return Err(EventFileError::Bad("CRC32 checksum mismatch: the file is corrupt".into()));
                }
            }
        }
        if event.header().event_type_raw() == MARIADB_START_ENCRYPTION {
            return Err(EventFileError::Bad(
                "the file is encrypted (MariaDB encrypt_binlog=ON); outbox-cdc cannot decrypt binlog files: \
                 stream them from a server instead"
                    .into(),
            ));
        }
        self.offset += bytes.len() as u64;
        Ok(Some(event))
    }

    fn error(&self, what: impl std::fmt::Display) -> Error {
        Error::definite(format!("binlog file {} at offset {}: {what}", self.path.display(), self.offset))
    }
}

enum EventFileError {
    /// The file ends inside an event.
    Truncated(String),
    /// Anything else: corrupt, not parseable, encrypted.
    Bad(String),
}

/// Reads a whole file through a decoder without outbox tables: its header, and where its last complete
/// transaction ends.
///
/// # Errors
/// A definite error for anything but a torn tail.
pub fn scan(path: &Path) -> Result<Scan> {
    let settings = Arc::new(ReaderSettings {
        server_id: 0,
        tables: Vec::new(),
        columns: Default::default(),
        on_update: Default::default(),
        heartbeat: std::time::Duration::from_secs(1),
        signal_table: None,
    });
    let len = std::fs::metadata(path).map_err(|e| Error::definite(format!("{}: {e}", path.display())))?.len();
    let mut file = EventFile::open(path)?;
    let mut decoder: Option<ChangeDecoder> = None;
    let mut header: Option<FileHeader> = None;
    let mut complete_end = file.offset;
    let tail = loop {
        let event = match file.next() {
            Ok(Some(event)) => event,
            Ok(None) => break None,
            Err(EventFileError::Truncated(e)) => break Some(e),
            Err(EventFileError::Bad(e)) => return Err(file.error(e)),
        };
        let type_code = event.header().event_type_raw();
        let h = header.get_or_insert_with(|| FileHeader {
            server_version: file.fde.server_version().trim_end_matches('\0').to_string(),
            flavor: if file.fde.server_version().to_ascii_lowercase().contains("mariadb") {
                Flavor::MariaDb
            } else {
                Flavor::MySql
            },
            server_id: event.header().server_id(),
            previous: Gtids::None,
            has_gtids: false,
        });
        if type_code == FORMAT_DESCRIPTION && decoder.is_none() {
            let start = Position { gtids: Gtids::None, coord: BinlogCoord { file: file_name(path), pos: 4 } };
            let mut d = ChangeDecoder::new(settings.clone(), file.checksum, start);
            d.expand_payloads();
            decoder = Some(d);
        }
        // Only the events the header needs are parsed here; the decoder checks the rest before parsing.
        match type_code {
            MARIADB_GTID_LIST => h.previous = Gtids::MariaDb(mariadb_gtid_list(&event).map_err(|e| file.error(e))?),
            MARIADB_GTID | MYSQL_GTID | MYSQL_GTID_TAGGED => h.has_gtids = true,
            MYSQL_PREVIOUS_GTIDS => match event.read_data() {
                Ok(Some(EventData::PreviousGtidsEvent(prev))) => {
                    h.previous = Gtids::MySql(previous_gtids(&prev).map_err(|e| file.error(e))?)
                }
                other => return Err(file.error(format!("unreadable PREVIOUS_GTIDS: {other:?}"))),
            },
            _ => {}
        }
        let Some(d) = decoder.as_mut() else {
            return Err(file.error("the file does not start with a FORMAT_DESCRIPTION event"));
        };
        d.handle(&event).map_err(|e| e.context(format_args!("{}", path.display())))?;
        while d.pop().is_some() {}
        if d.between_transactions() {
            complete_end = file.offset;
        }
    };
    let header = header.ok_or_else(|| file.error("the file holds no event"))?;
    let tail = match tail {
        Some(e) => Some(e),
        None if complete_end < len => Some("the file ends inside a transaction".to_string()),
        None => None,
    };
    Ok(Scan { header, complete_end, len, tail })
}

fn previous_gtids(prev: &mysql_common::binlog::events::PreviousGtidsEvent<'_>) -> Result<GtidSet> {
    let mut set = GtidSet::new();
    for sid in prev.sids() {
        let uuid = Uuid::from_bytes(sid.uuid());
        let tag = match sid.tag() {
            Some(t) => {
                Some(Tag::from_str(t.as_str()).map_err(|e| Error::definite(format!("PREVIOUS_GTIDS tag: {e}")))?)
            }
            None => None,
        };
        for interval in sid.intervals() {
            set.insert_range(uuid, tag.clone(), interval.start()..interval.end())
                .map_err(|e| Error::definite(format!("PREVIOUS_GTIDS interval: {e}")))?;
        }
    }
    Ok(set)
}

/// MariaDB GTID_LIST: count (low 28 bits) then count × (domain u32, server u32, seq u64), little-endian.
fn mariadb_gtid_list(event: &Event) -> Result<GtidPos> {
    let body = event.data();
    let short = || Error::definite(format!("GTID_LIST event too short ({} bytes)", body.len()));
    let count = u32::from_le_bytes(body.get(0..4).ok_or_else(short)?.try_into().expect("4 bytes")) & 0x0fff_ffff;
    let mut pos = GtidPos::new();
    for i in 0..count as usize {
        let entry = body.get(4 + i * 16..4 + (i + 1) * 16).ok_or_else(short)?;
        let u32_at = |o: usize| u32::from_le_bytes(entry[o..o + 4].try_into().expect("4 bytes"));
        let seq_no = u64::from_le_bytes(entry[8..16].try_into().expect("8 bytes"));
        let gtid = MariaGtid { domain_id: u32_at(0), server_id: u32_at(4), seq_no };
        // The list has one entry per (domain, server): after a failover a domain appears once per server
        // that wrote to it. The domain's position is its highest sequence number, wherever it sits in the list.
        if !pos.contains(&gtid) {
            pos.advance(gtid);
        }
    }
    Ok(pos)
}

/// The identity a files run checkpoints with: the writing server's flavor and id, marked as files so that
/// a checkpoint of a live server never silently resumes a files run, nor the other way round.
pub fn identity(header: &FileHeader) -> ServerIdentity {
    ServerIdentity { flavor: header.flavor, server_id: header.server_id, server_uuid: None, binlog_files: true }
}

/// The start position without a checkpoint: what the first file says was written before it, plus
/// `source.start_after`.
///
/// # Errors
/// A definite error when `start_after` does not parse as the files' GTID kind, or the files have none.
pub fn start_position(first: &Path, header: &FileHeader, start_after: Option<&str>) -> Result<Position> {
    let coord = BinlogCoord { file: file_name(first), pos: 4 };
    let bad = |e: &dyn std::fmt::Display| {
        let (kind, example) = match header.flavor {
            Flavor::MySql => ("MySQL GTID set", super::MYSQL_GTID_EXAMPLE),
            Flavor::MariaDb => ("MariaDB GTID position", super::MARIADB_GTID_EXAMPLE),
        };
        Error::definite(format!(
            "source.start_after = {start_after:?} is not a {kind}, as these files need (e.g. \"{example}\"): {e}"
        ))
    };
    let gtids = match (header.flavor, &header.previous, start_after) {
        (Flavor::MariaDb, previous, after) => {
            let mut pos = match previous {
                Gtids::MariaDb(p) => p.clone(),
                _ => GtidPos::new(),
            };
            if let Some(after) = after {
                for gtid in GtidPos::from_str(after).map_err(|e| bad(&e))?.iter() {
                    pos.advance(gtid);
                }
            }
            Gtids::MariaDb(pos)
        }
        (Flavor::MySql, previous, after) => {
            let mut set = match previous {
                Gtids::MySql(s) => s.clone(),
                _ => GtidSet::new(),
            };
            if let Some(after) = after {
                set.union(&GtidSet::from_str(after).map_err(|e| bad(&e))?);
            }
            if set.iter().next().is_none() && !header.has_gtids {
                if after.is_some() {
                    return Err(bad(&"the files hold no GTIDs (gtid_mode=OFF)"));
                }
                Gtids::None
            } else {
                Gtids::MySql(set)
            }
        }
    };
    Ok(Position { gtids, coord })
}

/// Reads binlog files in order through the decoder; the offline counterpart of
/// [`super::binlog::BinlogReader`].
pub struct FilesReader {
    /// Files not opened yet.
    files: VecDeque<PathBuf>,
    /// The file being read and where its last complete transaction ends.
    current: Option<(EventFile, u64)>,
    decoder: ChangeDecoder,
    /// The file the previous file's ROTATE named.
    expected_next: Option<String>,
    /// Flavor of the files read so far.
    flavor: Option<Flavor>,
}

impl FilesReader {
    /// Starts reading `files` (in index order) after `position`.
    ///
    /// # Errors
    /// A definite error when no file is left to read from the position.
    pub fn start(files: Vec<PathBuf>, settings: Arc<ReaderSettings>, position: Position) -> Result<Self> {
        let mut files: VecDeque<PathBuf> = files.into();
        if position.gtids == Gtids::None {
            // Without GTIDs, the coordinate's file is where the stream resumes; earlier files hold nothing new.
            let resume = index_order(Path::new(&position.coord.file));
            while files.front().is_some_and(|f| index_order(f) < resume) {
                files.pop_front();
            }
            if files.front().is_none_or(|f| file_name(f) != position.coord.file) {
                return Err(Error::definite(format!(
                    "the resume position {position} names binlog file {}, which is not among the configured \
                     files",
                    position.coord.file
                )));
            }
        }
        let mut decoder = ChangeDecoder::new(settings, true, position);
        decoder.skip_seen();
        decoder.expand_payloads();
        Ok(FilesReader { files, current: None, decoder, expected_next: None, flavor: None })
    }

    /// The next change; `None` once every file is consumed.
    ///
    /// Not an [`Iterator`]: it fails, and the caller stops at the first error.
    ///
    /// # Errors
    /// Definite errors (see the module documentation).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Change>> {
        loop {
            if let Some(change) = self.decoder.pop() {
                return Ok(Some(change));
            }
            let Some((file, end)) = self.current.as_mut() else {
                let Some(path) = self.files.pop_front() else {
                    return Ok(None);
                };
                let scan = scan(&path)?;
                self.check_continuity(&path, &scan.header)?;
                if let Some(tail) = &scan.tail {
                    let bytes = scan.len - scan.complete_end;
                    if !self.files.is_empty() {
                        return Err(Error::definite(format!(
                            "binlog file {} is incomplete ({tail}; {bytes} bytes after offset {}), yet later \
                             files follow it: the file is damaged and transactions in it may be lost. Restore \
                             it from a backup or remove it and the files before it and set source.start_after",
                            path.display(),
                            scan.complete_end
                        )));
                    }
                    tracing::warn!(
                        file = %path.display(),
                        complete_end = scan.complete_end,
                        ignored_bytes = bytes,
                        "the last binlog file ends in an incomplete transaction ({tail}): a file still being \
                         written or torn by a crash; such a transaction never committed and is not published"
                    );
                }
                tracing::info!(file = %path.display(), server = %scan.header.server_version, "reading binlog file");
                self.decoder.rotate_to(&file_name(&path));
                self.current = Some((EventFile::open(&path)?, scan.complete_end));
                continue;
            };
            if file.offset >= *end {
                tracing::info!(file = %file.path.display(), "binlog file consumed");
                // A ROTATE at its end named the next file; a STOP (server shutdown) did not.
                let name = file_name(&file.path);
                let rotated_to = &self.decoder.position().coord.file;
                self.expected_next = (*rotated_to != name).then(|| rotated_to.clone());
                self.current = None;
                continue;
            }
            let event = match file.next() {
                Ok(Some(event)) => event,
                // The pre-scan saw the file whole up to `end`: it changed under us.
                Ok(None) | Err(EventFileError::Truncated(_)) => {
                    return Err(file.error("the file shrank while it was read"));
                }
                Err(EventFileError::Bad(e)) => return Err(file.error(e)),
            };
            self.decoder.set_checksum(file.checksum);
            self.decoder.handle(&event)?;
        }
    }

    /// Position after the last transaction read.
    pub fn position(&self) -> &Position {
        self.decoder.position()
    }

    /// Refuses a file that does not continue what was read (or the resume position): a missing file in the
    /// middle would silently lose its transactions.
    fn check_continuity(&mut self, path: &Path, header: &FileHeader) -> Result<()> {
        let flavor = *self.flavor.get_or_insert(header.flavor);
        if flavor != header.flavor {
            return Err(Error::definite(format!(
                "{} was written by {:?}, the files before it by {flavor:?}: configure the files of one server",
                path.display(),
                header.flavor
            )));
        }
        let name = file_name(path);
        if let Some(expected) = self.expected_next.take() {
            if expected != name {
                return Err(Error::definite(format!(
                    "the previous binlog file rotated to {expected}, but the next file configured is {name}: \
                     {expected} is missing and its transactions would be lost. Add it (or remove the files before \
                     it and set source.start_after)"
                )));
            }
        }
        let position = self.decoder.position();
        let missing = match (&position.gtids, &header.previous) {
            (Gtids::MySql(have), Gtids::MySql(before)) => {
                (!before.is_subset(have)).then(|| format!("GTIDs {before} precede it, the position holds {have}"))
            }
            (Gtids::MariaDb(have), Gtids::MariaDb(before)) => before
                .iter()
                .find(|g| !have.contains(g))
                .map(|g| format!("GTID {g} precedes it, the position holds {have}")),
            _ => None,
        };
        match missing {
            Some(detail) => Err(Error::definite(format!(
                "binlog file {} does not continue from the position {position} ({detail}): transactions between \
                 them are in files that are not configured, and would be lost. Add the missing files, or — to \
                 accept the gap — move the state directory away and set source.start_after",
                path.display()
            ))),
            None => Ok(()),
        }
    }
}

/// `kind = "files"`: the first file's scan, for preflight and the start position.
///
/// # Errors
/// A definite error when the files cannot be listed or the first cannot be read.
pub fn inspect(source: &FilesSource) -> Result<(Vec<PathBuf>, Scan)> {
    let files = list_files(source)?;
    let first = files.first().ok_or_else(|| Error::definite("source.binlog_files is empty"))?;
    let scan = scan(first)?;
    Ok((files, scan))
}

#[cfg(test)]
mod tests;

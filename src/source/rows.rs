//! The hot path of decoding: after-images of an outbox table's rows events, straight into value slots.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, metrics, config).
//!
//! mysql_common's `RowsEvent::rows` builds, for every row, a `Column` (name, schema, table, flags,
//! charset: several heap copies) for every column and re-parses the table's optional metadata. At tens of
//! thousands of rows per second that was a quarter of the connector's CPU in `malloc`/`free`. Here the
//! per-column facts are read once per TABLE_MAP ([`RowLayout`]), and each row costs one small vector plus
//! the values the outbox needs; the other columns are parsed in place (to find where the next one starts)
//! and dropped without being copied.
//!
//! # Invariants
//! - Values are parsed by mysql_common's own `BinlogValue` deserializer with exactly the context its row
//!   parser passes (column type, metadata, signedness, not partial): the bytes are read the same way.
//!   `tests::same_values_as_mysql_common` checks that on every rows event of every fixture binlog.
//! - Only after-images of WRITE/UPDATE events are parsed; PARTIAL_UPDATE_ROWS is rejected before this.

use std::io;

use bitvec::slice::BitSlice;
use mysql_common::binlog::events::{OptionalMetaExtractor, RowsEventData, TableMapEvent};
use mysql_common::binlog::value::BinlogValue;
use mysql_common::constants::ColumnType;
use mysql_common::io::ParseBuf;

/// What the value parser needs about one column.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ColumnLayout {
    ty: ColumnType,
    meta: Vec<u8>,
    unsigned: bool,
    /// Slot this column's value goes to, if wanted.
    slot: Option<usize>,
}

/// The columns of a table as its TABLE_MAP describes them, and which of them to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowLayout {
    columns: Vec<ColumnLayout>,
    slots: usize,
}

/// One row's wanted values, by slot; `None` for a column absent from the image.
pub type Slots = Vec<Option<BinlogValue<'static>>>;

impl RowLayout {
    /// The layout of `tme`'s table, keeping column `wanted[s]` in slot `s`.
    ///
    /// # Errors
    /// When the TABLE_MAP has an unknown column type or malformed optional metadata.
    pub fn new(tme: &TableMapEvent<'_>, wanted: &[usize]) -> io::Result<Self> {
        let meta = OptionalMetaExtractor::new(tme.iter_optional_meta())?;
        let mut signedness = meta.iter_signedness();
        let count = tme.columns_count() as usize;
        let mut columns = Vec::with_capacity(count);
        for i in 0..count {
            let ty = match tme.get_column_type(i) {
                Ok(Some(ty)) => ty,
                Ok(None) => return Err(io::Error::new(io::ErrorKind::InvalidData, "no column type")),
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            };
            // NOTE: the signedness list has one entry per numeric column, in column order.
            let unsigned = ty.is_numeric_type() && signedness.next().unwrap_or(false);
            columns.push(ColumnLayout {
                ty,
                meta: tme.get_column_metadata(i).unwrap_or(&[]).to_vec(),
                unsigned,
                slot: wanted.iter().position(|&w| w == i),
            });
        }
        Ok(RowLayout { columns, slots: wanted.len() })
    }

    /// The after-images of `event`'s rows (WRITE_ROWS, or the new values of UPDATE_ROWS); a DELETE_ROWS
    /// or PARTIAL_UPDATE_ROWS event yields one error.
    pub fn after_images<'a>(&'a self, event: &'a RowsEventData<'a>) -> AfterImages<'a> {
        use RowsEventData as R;
        let bits = |slice: &BitSlice<u8>| slice.iter().map(|b| *b).collect::<Vec<bool>>();
        let (before, after, data) = match event {
            R::WriteRowsEventV1(e) => (None, Some(e.columns_after_image()), e.rows_data()),
            R::WriteRowsEvent(e) => (None, Some(e.columns_after_image()), e.rows_data()),
            R::UpdateRowsEventV1(e) => (Some(e.columns_before_image()), Some(e.columns_after_image()), e.rows_data()),
            R::UpdateRowsEvent(e) => (Some(e.columns_before_image()), Some(e.columns_after_image()), e.rows_data()),
            R::DeleteRowsEventV1(e) => (Some(e.columns_before_image()), None, e.rows_data()),
            R::DeleteRowsEvent(e) => (Some(e.columns_before_image()), None, e.rows_data()),
            // Partial JSON images need the shared-image header: not an outbox insert, never parsed here.
            R::PartialUpdateRowsEvent(e) => (None, None, e.rows_data()),
        };
        AfterImages { layout: self, before: before.map(bits), after: after.map(bits), buf: ParseBuf(data) }
    }
}

/// Iterator over after-images; see [`RowLayout::after_images`].
pub struct AfterImages<'a> {
    layout: &'a RowLayout,
    /// Columns present in the before-image (UPDATE/DELETE), once per event.
    before: Option<Vec<bool>>,
    /// Columns present in the after-image (WRITE/UPDATE).
    after: Option<Vec<bool>>,
    buf: ParseBuf<'a>,
}

impl AfterImages<'_> {
    /// Parses one image whose present columns are `present`; keeps wanted values when `keep`.
    fn image(&mut self, present: &[bool], keep: bool) -> io::Result<Slots> {
        let mut slots: Slots = if keep { vec![None; self.layout.slots] } else { Vec::new() };
        let in_image = present.iter().filter(|p| **p).count();
        let nulls: &[u8] = self.buf.parse(in_image.div_ceil(8))?;
        let mut image_index = 0;
        for (column, &is_present) in self.layout.columns.iter().zip(present) {
            if !is_present {
                continue;
            }
            let null = nulls[image_index / 8] & (1 << (image_index % 8)) != 0;
            image_index += 1;
            let value = if null {
                BinlogValue::Value(mysql_common::Value::NULL)
            } else {
                self.buf.parse::<BinlogValue<'_>>((column.ty, column.meta.as_slice(), column.unsigned, false))?
            };
            if let (true, Some(slot)) = (keep, column.slot) {
                slots[slot] = Some(value.into_owned());
            }
        }
        Ok(slots)
    }
}

impl Iterator for AfterImages<'_> {
    type Item = io::Result<Slots>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() {
            return None;
        }
        let (before, after) = (self.before.take(), self.after.take());
        let mut parse = || {
            if let Some(before) = &before {
                self.image(before, false)?;
            }
            match &after {
                Some(after) => self.image(after, true),
                None => Err(io::Error::new(io::ErrorKind::InvalidData, "rows event without an after-image")),
            }
        };
        let result = parse();
        (self.before, self.after) = (before, after);
        if result.is_err() {
            // A malformed event: stop rather than read garbage as the next row.
            self.buf = ParseBuf(&[]);
        }
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufReader, Read};
    use std::path::{Path, PathBuf};

    use mysql_common::binlog::consts::BinlogVersion;
    use mysql_common::binlog::events::EventData;
    use mysql_common::binlog::BinlogFile;

    use super::*;

    fn binlog_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                binlog_files(&path, out);
            } else {
                let mut magic = [0u8; 4];
                let is_binlog = std::fs::File::open(&path).and_then(|mut f| f.read_exact(&mut magic)).is_ok()
                    && magic == *b"\xfebin";
                if is_binlog {
                    out.push(path);
                }
            }
        }
    }

    /// The fast path reads every after-image of every rows event in every fixture binlog (MySQL 5.5–9.6,
    /// Percona, MariaDB: all column types there) exactly as mysql_common's row parser does.
    #[test]
    fn same_values_as_mysql_common() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/binlog");
        let mut files = Vec::new();
        binlog_files(&root, &mut files);
        assert!(files.len() > 5, "fixture binlogs missing under {}", root.display());
        let (mut rows_compared, mut files_with_rows) = (0usize, 0usize);
        for path in files {
            let Ok(events) =
                BinlogFile::new(BinlogVersion::Version4, BufReader::new(std::fs::File::open(&path).unwrap()))
            else {
                continue;
            };
            let mut tables = std::collections::HashMap::new();
            let before = rows_compared;
            for event in events {
                let Ok(event) = event else { break };
                let Ok(Some(data)) = event.read_data() else { continue };
                match data {
                    EventData::TableMapEvent(tme) => {
                        tables.insert(tme.table_id(), tme.into_owned());
                    }
                    EventData::RowsEvent(rows) => {
                        let Some(tme) = tables.get(&rows.table_id()) else { continue };
                        if !matches!(
                            rows,
                            RowsEventData::WriteRowsEvent(_)
                                | RowsEventData::WriteRowsEventV1(_)
                                | RowsEventData::UpdateRowsEvent(_)
                                | RowsEventData::UpdateRowsEventV1(_)
                        ) {
                            continue;
                        }
                        let all: Vec<usize> = (0..tme.columns_count() as usize).collect();
                        let layout = RowLayout::new(tme, &all).unwrap();
                        let theirs: Vec<_> = rows.rows(tme).collect();
                        let ours: Vec<_> = layout.after_images(&rows).collect();
                        assert_eq!(ours.len(), theirs.len(), "{}", path.display());
                        for (ours, theirs) in ours.into_iter().zip(theirs) {
                            let Ok((_, Some(theirs))) = theirs else {
                                assert!(ours.is_err(), "{}: mysql_common failed, we did not", path.display());
                                continue;
                            };
                            let theirs = theirs.unwrap();
                            let ours: Vec<_> = ours.unwrap().into_iter().flatten().collect();
                            let present: Vec<_> = theirs.into_iter().collect();
                            assert_eq!(ours, present, "{}", path.display());
                            rows_compared += 1;
                        }
                    }
                    _ => {}
                }
            }
            if rows_compared > before {
                files_with_rows += 1;
            }
        }
        eprintln!("compared {rows_compared} rows in {files_with_rows} files");
        assert!(rows_compared > 100 && files_with_rows > 5, "{rows_compared} rows in {files_with_rows} files");
    }
}

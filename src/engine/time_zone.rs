//! The `timezone` argument of the date operators: a fixed offset (`+HH`, `+HHMM`, `+HH:MM`), a
//! name of UTC, `Etc/GMT±N`, or any Olson name of the system's time zone database, read from
//! `$TZDIR` (else `/usr/share/zoneinfo`) with [`super::tzif`].
//!
//! Names are checked before any file is opened (letters, digits and `_+-/` only, so never `..`
//! nor an absolute path; at most [`MAX_NAME`] bytes), and the file found must lie inside the
//! zone directory once symbolic links are resolved. Parsed zones are kept in a map of at most
//! [`MAX_CACHED`] entries, so no client can grow it without bound. A name with no valid file is
//! refused with mongod's 40485, as mongod refuses a name its database lacks.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use bson::Bson;

use super::aggregate::err;
use super::expressions::nullish;
use super::tzif::Zone;
use super::EngineError;
use crate::value::field::type_name;

/// The longest zone name looked up (the longest in the database is under 40 bytes).
pub const MAX_NAME: usize = 255;
/// The most zones kept parsed at once (the database has about 600).
pub const MAX_CACHED: usize = 128;
/// The largest TZif file read (the largest in the database is under 4 KB).
const MAX_FILE: u64 = 1 << 20;

/// A date operator's time zone.
#[derive(Debug, Clone)]
pub enum TimeZone {
    /// A fixed offset from UTC, in milliseconds (0 for UTC).
    Fixed(i64),
    /// A zone of the time zone database.
    Named(Arc<Zone>),
}

impl TimeZone {
    /// UTC, the zone of a date operator without `timezone`.
    pub const UTC: TimeZone = TimeZone::Fixed(0);

    /// The offset (ms) of local time from UTC at the instant `utc_ms`.
    pub fn offset_at(&self, utc_ms: i64) -> i64 {
        match self {
            TimeZone::Fixed(ms) => *ms,
            TimeZone::Named(z) => z.period_at(utc_ms.div_euclid(1000)).kind.offset * 1000,
        }
    }

    /// The local wall time (as ms since the epoch read as UTC) at the instant `utc_ms`.
    pub fn local(&self, utc_ms: i64) -> i64 {
        utc_ms.saturating_add(self.offset_at(utc_ms))
    }

    /// Whether the instant is in daylight saving time.
    pub fn is_dst_at(&self, utc_ms: i64) -> bool {
        match self {
            TimeZone::Fixed(_) => false,
            TimeZone::Named(z) => z.period_at(utc_ms.div_euclid(1000)).kind.is_dst,
        }
    }

    /// The instant a local wall time names, as mongod's timelib chooses it (see
    /// [`Zone::local_to_utc`]); `dst_hint` is the daylight saving state of the instant the wall
    /// time was derived from. `None` when out of range.
    pub fn to_utc(&self, local_ms: i64, dst_hint: bool) -> Option<i64> {
        match self {
            TimeZone::Fixed(ms) => local_ms.checked_sub(*ms),
            TimeZone::Named(z) => z.local_to_utc(local_ms, dst_hint),
        }
    }

    /// The instant a wall time built from parts or parsed from a string names: timelib reads it
    /// with the daylight saving state of the epoch as its hint, as mongod's
    /// `TimeZone::createFromDateParts` and `$dateFromString` leave it.
    pub fn wall_to_utc(&self, local_ms: i64) -> Option<i64> {
        self.to_utc(local_ms, self.is_dst_at(0))
    }

    /// Whether this is UTC itself (mongod's `isUtcZone`): `$dateToString`'s default format ends
    /// in `Z` only then.
    pub fn is_utc(&self) -> bool {
        matches!(self, TimeZone::Fixed(0))
    }
}

/// The names of UTC the date operators accept even without a time zone database.
const UTC_NAMES: &[&str] = &[
    "UTC",
    "GMT",
    "Z",
    "Etc/UTC",
    "Etc/GMT",
    "Etc/UCT",
    "Etc/Universal",
    "Etc/Zulu",
    "Etc/Greenwich",
    "Etc/GMT0",
    "Etc/GMT+0",
    "Etc/GMT-0",
    "GMT0",
    "GMT+0",
    "GMT-0",
    "UCT",
    "Universal",
    "Zulu",
    "Greenwich",
];

/// A fixed offset `+HH`, `+HHMM` or `+HH:MM` (or `-`), in milliseconds.
fn parse_offset(s: &str) -> Option<i64> {
    let sign = match s.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let rest = &s[1..];
    // Slicing by byte below is only safe on ASCII: "+aé1" has four bytes, and byte 2 is inside
    // the "é".
    if !rest.is_ascii() {
        return None;
    }
    let (h, m) = match rest.len() {
        2 => (rest, "00"),
        4 => (&rest[..2], &rest[2..]),
        5 if rest.as_bytes()[2] == b':' => (&rest[..2], &rest[3..]),
        _ => return None,
    };
    if !h.bytes().chain(m.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
    Some(sign * (h * 3_600_000 + m * 60_000))
}

/// A date operator's `timezone`: UTC when absent, `None` when it is null (the operator's
/// result is null); 40517 for a value that is not a string, 40485 for an unknown name.
pub fn time_zone(v: Option<Bson>) -> Result<Option<TimeZone>, EngineError> {
    let s = match v {
        None => return Ok(Some(TimeZone::UTC)),
        Some(v) if nullish(&v) => return Ok(None),
        Some(Bson::String(s)) => s,
        Some(other) => {
            return Err(err(
                40517,
                format!(
                    "timezone must evaluate to a string, found {}",
                    type_name(&other)
                ),
            ))
        }
    };
    if let Some(ms) = parse_offset(&s) {
        return Ok(Some(TimeZone::Fixed(ms)));
    }
    if UTC_NAMES.contains(&s.as_str()) {
        return Ok(Some(TimeZone::UTC));
    }
    if let Some(n) = s.strip_prefix("Etc/GMT") {
        // POSIX's inverted sign: Etc/GMT+5 is five hours behind UTC.
        if let Some(h) = n
            .strip_prefix(['+', '-'])
            .and_then(|h| h.parse::<i64>().ok())
            .filter(|h| (1..=14).contains(h) && !n[1..].starts_with('0'))
        {
            let sign = if n.starts_with('+') { -1 } else { 1 };
            if sign == -1 && h > 12 {
                return Err(unknown_zone(&s));
            }
            return Ok(Some(TimeZone::Fixed(sign * h * 3_600_000)));
        }
    }
    match named(&s) {
        Some(z) => Ok(Some(TimeZone::Named(z))),
        None => Err(unknown_zone(&s)),
    }
}

fn unknown_zone(s: &str) -> EngineError {
    err(40485, format!("unrecognized time zone identifier: \"{s}\""))
}

/// The zone directory: `$TZDIR` when set, else the usual system path.
fn zone_dir() -> PathBuf {
    std::env::var_os("TZDIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/share/zoneinfo"))
}

/// Parsed zones by name.
fn cache() -> &'static Mutex<HashMap<String, Arc<Zone>>> {
    static ZONES: OnceLock<Mutex<HashMap<String, Arc<Zone>>>> = OnceLock::new();
    ZONES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The zone of an Olson name, from the cache or the zone directory. Only zones that exist are
/// kept; when the map is full one entry makes room.
fn named(name: &str) -> Option<Arc<Zone>> {
    if !valid_name(name) {
        return None;
    }
    if let Some(z) = cache().lock().unwrap_or_else(|e| e.into_inner()).get(name) {
        return Some(z.clone());
    }
    let zone = Arc::new(read_zone(&zone_dir(), name)?);
    let mut map = cache().lock().unwrap_or_else(|e| e.into_inner());
    if map.len() >= MAX_CACHED && !map.contains_key(name) {
        if let Some(k) = map.keys().next().cloned() {
            map.remove(&k);
        }
    }
    map.insert(name.to_string(), zone.clone());
    Some(zone)
}

/// Whether `name` may be looked up: 1 to [`MAX_NAME`] bytes of letters, digits and `_+-/`,
/// with no empty path component (so no leading `/`). Without `.` there is no `..`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'-' | b'/'))
        && name.split('/').all(|part| !part.is_empty())
}

/// Reads and parses the zone `name` under `dir`; `None` for a bad name, a file that is missing,
/// not a regular file, outside `dir` once links are resolved, too large, or not valid TZif.
pub fn read_zone(dir: &Path, name: &str) -> Option<Zone> {
    if !valid_name(name) {
        return None;
    }
    let root = dir.canonicalize().ok()?;
    let path = root.join(name).canonicalize().ok()?;
    if !path.starts_with(&root) {
        return None;
    }
    let file = std::fs::File::open(&path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut data = Vec::new();
    file.take(MAX_FILE).read_to_end(&mut data).ok()?;
    Zone::parse(&data)
}

#[cfg(test)]
mod tests;

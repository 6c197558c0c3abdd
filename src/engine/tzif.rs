//! Time zone rules from TZif files (RFC 8536, versions 1 to 4), the format of the system's time
//! zone database: transition instants, the local time types they start, and the POSIX TZ string
//! in the footer (`CET-1CEST,M3.5.0,M10.5.0/3`) that gives the rule after the last transition.
//!
//! A [`Zone`] answers two questions: which offset is in force at an instant
//! ([`Zone::period_at`]), and which instant a local wall time names ([`Zone::local_to_utc`]),
//! the second resolved as timelib (mongod's date library) resolves it. No I/O here: the bytes
//! come from [`super::time_zone`], which finds, checks and caches the files.

use super::expressions::{civil, days_from_civil};

/// The largest UTC offset a local time type may have, in seconds (RFC 8536: -89999..=93599).
const MAX_OFFSET: i64 = 93_599;
const MIN_OFFSET: i64 = -89_999;
const DAY_S: i64 = 86_400;

/// A local time type: its offset from UTC and whether it is daylight saving time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalType {
    /// Seconds east of UTC.
    pub offset: i64,
    /// Whether the type is daylight saving time (TZif's `isdst`).
    pub is_dst: bool,
}

/// The local time type in force at an instant, and the transition that started it (`None`:
/// before the first transition, where the type is the file's first, or a footer-only zone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    /// The type in force.
    pub kind: LocalType,
    /// When it began, in seconds since the epoch.
    pub since: Option<i64>,
}

/// The rules of one time zone, parsed from a TZif file.
#[derive(Debug, Clone)]
pub struct Zone {
    /// Transition instants, seconds since the epoch, strictly ascending.
    times: Vec<i64>,
    /// For each transition, the index in `types` of the local time type it starts.
    starts: Vec<usize>,
    /// The local time types; the first is in force before the first transition.
    types: Vec<LocalType>,
    /// The footer's rule, for instants at or after the last transition.
    rule: Option<Rule>,
}

/// The six counts of a TZif header.
#[derive(Debug, Clone, Copy)]
struct Counts {
    isut: usize,
    isstd: usize,
    leap: usize,
    time: usize,
    types: usize,
    chars: usize,
}

impl Counts {
    /// The size of the data block these counts describe, with `time_size`-byte times.
    fn block_len(&self, time_size: usize) -> Option<usize> {
        let parts = [
            self.time.checked_mul(time_size)?,
            self.time,
            self.types.checked_mul(6)?,
            self.chars,
            self.leap.checked_mul(time_size + 4)?,
            self.isstd,
            self.isut,
        ];
        parts.iter().try_fold(0usize, |a, b| a.checked_add(*b))
    }
}

/// Reads a TZif header at the start of `data`: the version byte and the counts.
fn header(data: &[u8]) -> Option<(u8, Counts)> {
    if data.len() < 44 || &data[..4] != b"TZif" {
        return None;
    }
    let version = data[4];
    if version != 0 && !(b'2'..=b'9').contains(&version) {
        return None;
    }
    let count = |i: usize| -> Option<usize> {
        let b: [u8; 4] = data.get(20 + 4 * i..24 + 4 * i)?.try_into().ok()?;
        usize::try_from(u32::from_be_bytes(b)).ok()
    };
    let counts = Counts {
        isut: count(0)?,
        isstd: count(1)?,
        leap: count(2)?,
        time: count(3)?,
        types: count(4)?,
        chars: count(5)?,
    };
    // RFC 8536 section 3.1: at least one type; the indicator arrays are empty or one per type.
    if counts.types == 0
        || (counts.isut != 0 && counts.isut != counts.types)
        || (counts.isstd != 0 && counts.isstd != counts.types)
    {
        return None;
    }
    Some((version, counts))
}

impl Zone {
    /// Parses a TZif file: the 64-bit data block and footer of version 2 and later, the 32-bit
    /// block of version 1. `None` for anything malformed.
    pub fn parse(data: &[u8]) -> Option<Zone> {
        let (version, v1) = header(data)?;
        if version == 0 {
            let block = data.get(44..44 + v1.block_len(4)?)?;
            return Zone::from_block(block, v1, 4, None);
        }
        let second = 44usize.checked_add(v1.block_len(4)?)?;
        let rest = data.get(second..)?;
        let (_, counts) = header(rest)?;
        let len = counts.block_len(8)?;
        let block = rest.get(44..44 + len)?;
        // The footer: a newline, the POSIX TZ string (perhaps empty), a newline.
        let footer = rest.get(44 + len..)?;
        let footer = footer.strip_prefix(b"\n")?;
        let end = footer.iter().position(|b| *b == b'\n')?;
        let text = std::str::from_utf8(&footer[..end]).ok()?;
        let rule = if text.is_empty() {
            None
        } else {
            Some(Rule::parse(text)?)
        };
        Zone::from_block(block, counts, 8, rule)
    }

    fn from_block(block: &[u8], c: Counts, time_size: usize, rule: Option<Rule>) -> Option<Zone> {
        let mut times = Vec::with_capacity(c.time);
        for i in 0..c.time {
            let b = &block[i * time_size..(i + 1) * time_size];
            let t = if time_size == 4 {
                i32::from_be_bytes(b.try_into().ok()?) as i64
            } else {
                i64::from_be_bytes(b.try_into().ok()?)
            };
            if times.last().is_some_and(|last| *last >= t) {
                return None;
            }
            times.push(t);
        }
        let idx = &block[c.time * time_size..c.time * (time_size + 1)];
        let starts: Vec<usize> = idx.iter().map(|i| *i as usize).collect();
        if starts.iter().any(|i| *i >= c.types) {
            return None;
        }
        let records = &block[c.time * (time_size + 1)..c.time * (time_size + 1) + 6 * c.types];
        let mut types = Vec::with_capacity(c.types);
        for r in records.chunks_exact(6) {
            let offset = i32::from_be_bytes([r[0], r[1], r[2], r[3]]) as i64;
            if !(MIN_OFFSET..=MAX_OFFSET).contains(&offset) || r[4] > 1 {
                return None;
            }
            if (r[5] as usize) >= c.chars.max(1) {
                return None;
            }
            types.push(LocalType {
                offset,
                is_dst: r[4] == 1,
            });
        }
        Some(Zone {
            times,
            starts,
            types,
            rule,
        })
    }

    /// A zone with one offset and no transitions (for tests and fixed names).
    #[cfg(test)]
    pub fn fixed(offset: i64) -> Zone {
        Zone {
            times: Vec::new(),
            starts: Vec::new(),
            types: vec![LocalType {
                offset,
                is_dst: false,
            }],
            rule: None,
        }
    }

    /// The local time type in force at `t` (seconds since the epoch), as timelib finds it:
    /// the first type before the first transition, the footer's rule at or after the last.
    pub fn period_at(&self, t: i64) -> Period {
        let n = self.times.partition_point(|x| *x <= t);
        let last = self.times.last().copied();
        match (&self.rule, n) {
            (Some(rule), _) if n == self.times.len() => rule.period_at(t, last),
            (_, 0) => Period {
                kind: self.types[0],
                since: None,
            },
            _ => Period {
                kind: self.types[self.starts[n - 1]],
                since: Some(self.times[n - 1]),
            },
        }
    }

    /// The instant (ms since the epoch) a local wall time (`local_ms`, the wall clock read as
    /// if it were UTC) names, as timelib's `do_adjust_timezone` resolves it. `dst_hint` is
    /// whether the time being adjusted was last known to be in daylight saving time (timelib's
    /// `dst` field). With no hint, a wall time in a gap (spring forward) is read with the offset
    /// in force before the gap, so it lands as far after the gap's end as it was after its
    /// start; a wall time that occurs twice (fall back) is the later one, in standard time.
    /// `None` when the result is outside the range of 64-bit milliseconds.
    pub fn local_to_utc(&self, local_ms: i64, dst_hint: bool) -> Option<i64> {
        let (sse, frac) = (local_ms.div_euclid(1000), local_ms.rem_euclid(1000));
        let current = self.period_at(sse);
        let c = current.kind.offset;
        let after = self.period_at(sse - c);
        let mut actual = after;
        if c == after.kind.offset {
            // timelib looks two hours either side when the hint and the type at the wall time
            // read as UTC disagree about daylight saving time.
            if c >= 0 && dst_hint && !current.kind.is_dst {
                let earlier = self.period_at(sse - c - 7200);
                if earlier.kind.offset != after.kind.offset
                    && after.since.is_some_and(|t| sse - earlier.kind.offset < t)
                {
                    actual = earlier;
                }
            } else if c <= 0 && current.kind.is_dst && !dst_hint {
                let later = self.period_at(sse - c + 7200);
                if later.kind.offset != after.kind.offset
                    && later.since.is_none_or(|t| sse - later.kind.offset >= t)
                {
                    actual = later;
                }
            }
        }
        let a = actual.kind.offset;
        let in_transition = actual.since.is_some_and(|t| sse - c >= t && sse - a < t);
        let offset = if c != a && !in_transition { a } else { c };
        (sse - offset).checked_mul(1000)?.checked_add(frac)
    }
}

/// A POSIX TZ string as TZif footers carry it (with RFC 8536's extensions: hours up to 167 and
/// negative in the transition times).
#[derive(Debug, Clone, PartialEq)]
struct Rule {
    std: LocalType,
    dst: Option<DstRule>,
}

/// When daylight saving time starts and ends each year.
#[derive(Debug, Clone, PartialEq)]
struct DstRule {
    kind: LocalType,
    start: RuleDate,
    /// Seconds after local (standard) midnight of the start day.
    start_time: i64,
    end: RuleDate,
    /// Seconds after local (daylight) midnight of the end day.
    end_time: i64,
}

/// A day of the year in a POSIX TZ rule.
#[derive(Debug, Clone, Copy, PartialEq)]
enum RuleDate {
    /// `Jn`: day 1 to 365, February 29th never counted.
    Julian(i64),
    /// `n`: day 0 to 365, February 29th counted.
    Zero(i64),
    /// `Mm.w.d`: day `d` (0 Sunday) of week `w` (5 the last) of month `m`.
    Week { month: u32, week: i64, day: i64 },
}

/// A cursor over a POSIX TZ string.
struct Text<'a> {
    s: &'a [u8],
    at: usize,
}

impl Text<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        if hit {
            self.at += 1;
        }
        hit
    }

    fn number(&mut self, max_digits: usize) -> Option<i64> {
        let start = self.at;
        while self.at - start < max_digits && self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        if self.at == start {
            return None;
        }
        std::str::from_utf8(&self.s[start..self.at])
            .ok()?
            .parse()
            .ok()
    }

    /// A zone abbreviation: three or more letters, or `<...>` of letters, digits and signs.
    fn name(&mut self) -> Option<()> {
        let start = self.at;
        if self.eat(b'<') {
            while self
                .peek()
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-')
            {
                self.at += 1;
            }
            let len = self.at - start - 1;
            return (self.eat(b'>') && len >= 3).then_some(());
        }
        while self.peek().is_some_and(|b| b.is_ascii_alphabetic()) {
            self.at += 1;
        }
        (self.at - start >= 3).then_some(())
    }

    /// `[+-]hh[:mm[:ss]]` in seconds, hours at most `max_hours`.
    fn time(&mut self, max_hours: i64) -> Option<i64> {
        let sign = if self.eat(b'-') {
            -1
        } else {
            self.eat(b'+');
            1
        };
        let h = self.number(3)?;
        let mut m = 0;
        let mut s = 0;
        if self.eat(b':') {
            m = self.number(2)?;
            if self.eat(b':') {
                s = self.number(2)?;
            }
        }
        if h > max_hours || m > 59 || s > 59 {
            return None;
        }
        Some(sign * (h * 3600 + m * 60 + s))
    }

    /// A rule's date and time (`M3.5.0/3`); the time defaults to 02:00.
    fn date(&mut self) -> Option<(RuleDate, i64)> {
        let date = if self.eat(b'J') {
            RuleDate::Julian(self.number(3).filter(|n| (1..=365).contains(n))?)
        } else if self.eat(b'M') {
            let month = self.number(2).filter(|n| (1..=12).contains(n))? as u32;
            let week = self.eat(b'.').then(|| self.number(1))??;
            let day = self.eat(b'.').then(|| self.number(1))??;
            if !(1..=5).contains(&week) || day > 6 {
                return None;
            }
            RuleDate::Week { month, week, day }
        } else {
            RuleDate::Zero(self.number(3).filter(|n| *n <= 365)?)
        };
        let time = if self.eat(b'/') {
            self.time(167)?
        } else {
            7200
        };
        Some((date, time))
    }
}

impl Rule {
    /// Parses a TZ string; `None` when it is not one (or has daylight saving time without the
    /// dates it starts and ends, which TZif footers always give).
    fn parse(s: &str) -> Option<Rule> {
        let mut t = Text {
            s: s.as_bytes(),
            at: 0,
        };
        t.name()?;
        // POSIX offsets count hours west of UTC.
        let std = LocalType {
            offset: -t.time(24)?,
            is_dst: false,
        };
        if t.peek().is_none() {
            return Some(Rule { std, dst: None });
        }
        t.name()?;
        let offset = match t.peek() {
            Some(b',') => std.offset + 3600,
            _ => -t.time(24)?,
        };
        if !t.eat(b',') {
            return None;
        }
        let (start, start_time) = t.date()?;
        if !t.eat(b',') {
            return None;
        }
        let (end, end_time) = t.date()?;
        if t.peek().is_some() {
            return None;
        }
        Some(Rule {
            std,
            dst: Some(DstRule {
                kind: LocalType {
                    offset,
                    is_dst: true,
                },
                start,
                start_time,
                end,
                end_time,
            }),
        })
    }

    /// The type in force at `t` after the file's last transition (`last`): the latest of the
    /// rule's transitions in the years around `t` that is not after it.
    fn period_at(&self, t: i64, last: Option<i64>) -> Period {
        let Some(dst) = &self.dst else {
            return Period {
                kind: self.std,
                since: last,
            };
        };
        let (year, _, _) = civil(t.div_euclid(DAY_S));
        let mut best: Option<(i64, LocalType)> = None;
        for y in [year - 1, year, year + 1] {
            // The start is written in standard time, the end in daylight saving time.
            let start = day_of(dst.start, y) * DAY_S + dst.start_time - self.std.offset;
            let end = day_of(dst.end, y) * DAY_S + dst.end_time - dst.kind.offset;
            for (at, kind) in [(start, dst.kind), (end, self.std)] {
                // On a tie the later rule wins (a zone in daylight saving time all year).
                if at <= t && best.is_none_or(|(b, _)| at >= b) {
                    best = Some((at, kind));
                }
            }
        }
        match best {
            Some((at, kind)) => Period {
                kind,
                since: Some(at),
            },
            None => Period {
                kind: self.std,
                since: last,
            },
        }
    }
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// The day (since 1970-01-01) a rule date falls on in year `y`.
fn day_of(date: RuleDate, y: i64) -> i64 {
    let jan1 = days_from_civil(y, 1, 1);
    match date {
        RuleDate::Julian(n) => jan1 + n - 1 + i64::from(is_leap(y) && n >= 60),
        RuleDate::Zero(n) => jan1 + n,
        RuleDate::Week { month, week, day } => {
            let first = days_from_civil(y, month, 1);
            let next = if month == 12 {
                days_from_civil(y + 1, 1, 1)
            } else {
                days_from_civil(y, month + 1, 1)
            };
            // 1970-01-01 was a Thursday (4 days after Sunday).
            let first_dow = (first + 4).rem_euclid(7);
            let mut d = first + (day - first_dow).rem_euclid(7) + (week - 1) * 7;
            while d >= next {
                d -= 7;
            }
            d
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posix_rules_parse() {
        let paris = Rule::parse("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        assert_eq!(paris.std.offset, 3600);
        let dst = paris.dst.as_ref().unwrap();
        assert_eq!(dst.kind.offset, 7200);
        assert_eq!((dst.start_time, dst.end_time), (7200, 10800));
        let howe = Rule::parse("<+1030>-10:30<+11>-11,M10.1.0,M4.1.0").unwrap();
        assert_eq!(howe.std.offset, 37_800);
        assert_eq!(howe.dst.unwrap().kind.offset, 39_600);
        let kolkata = Rule::parse("IST-5:30").unwrap();
        assert_eq!((kolkata.std.offset, kolkata.dst), (19_800, None));
        // The default daylight offset is one hour ahead; extended hours and Julian days.
        let r = Rule::parse("EST5EDT,0/0,J365/25").unwrap();
        assert_eq!(r.dst.as_ref().unwrap().kind.offset, -14_400);
        assert_eq!(r.dst.unwrap().end_time, 25 * 3600);
        for bad in [
            "",
            "E5",
            "EST",
            "EST5EDT",
            "EST5EDT,M3.2.0",
            "EST5EDT,M13.2.0,M11.1.0",
            "<AB>5",
            "EST5EDT,M3.2.0,M11.1.0x",
        ] {
            assert_eq!(Rule::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn rule_dates() {
        // 2024: last Sunday of March is the 31st, second Sunday of March the 10th.
        assert_eq!(
            day_of(
                RuleDate::Week {
                    month: 3,
                    week: 5,
                    day: 0
                },
                2024
            ),
            days_from_civil(2024, 3, 31)
        );
        assert_eq!(
            day_of(
                RuleDate::Week {
                    month: 3,
                    week: 2,
                    day: 0
                },
                2024
            ),
            days_from_civil(2024, 3, 10)
        );
        assert_eq!(
            day_of(RuleDate::Julian(60), 2024),
            days_from_civil(2024, 3, 1)
        );
        assert_eq!(
            day_of(RuleDate::Zero(59), 2024),
            days_from_civil(2024, 2, 29)
        );
    }

    #[test]
    fn malformed_files_are_refused() {
        assert!(Zone::parse(b"").is_none());
        assert!(Zone::parse(b"TZif2").is_none());
        let mut h = b"TZif".to_vec();
        h.resize(44, 0);
        // Zero types.
        assert!(Zone::parse(&h).is_none());
        // Counts larger than the file.
        h[40..44].copy_from_slice(&1u32.to_be_bytes());
        h[32..36].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(Zone::parse(&h).is_none());
        // A version 1 file with one type and no transitions is a fixed zone.
        let mut v1 = b"TZif".to_vec();
        v1.resize(44, 0);
        v1[36..40].copy_from_slice(&1u32.to_be_bytes());
        v1[40..44].copy_from_slice(&4u32.to_be_bytes());
        v1.extend_from_slice(&[0, 0, 0x0e, 0x10, 0, 0]);
        v1.extend_from_slice(b"ABC\0");
        let z = Zone::parse(&v1).unwrap();
        assert_eq!(z.period_at(0).kind.offset, 3600);
        assert_eq!(Zone::fixed(3600).period_at(0), z.period_at(0));
    }
}

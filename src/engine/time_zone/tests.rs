//! Olson zones against offsets known from the tz database (checked with Python's `zoneinfo`),
//! through the date operators, and the refusal of names that must not reach the file system.

use bson::{doc, Bson, Document};

use super::*;

fn eval(e: Document) -> Result<Bson, EngineError> {
    super::super::aggregate::eval(&Bson::Document(e), &doc! {}).map(|v| v.unwrap_or(Bson::Null))
}

fn date(s: &str) -> Bson {
    Bson::DateTime(bson::DateTime::parse_rfc3339_str(s).unwrap())
}

/// `$dateToString` of an instant in a zone, as `local time offset offset-in-minutes`.
fn local(zone: &str, utc: &str) -> String {
    let r = eval(doc! {"$dateToString": {
        "date": date(utc), "format": "%Y-%m-%dT%H:%M:%S %z %Z", "timezone": zone,
    }});
    match r {
        Ok(Bson::String(s)) => s,
        other => panic!("{zone} {utc}: {other:?}"),
    }
}

fn zone(name: &str) -> TimeZone {
    time_zone(Some(Bson::String(name.into())))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .unwrap()
}

fn ms(s: &str) -> i64 {
    bson::DateTime::parse_rfc3339_str(s)
        .unwrap()
        .timestamp_millis()
}

#[test]
fn new_york_changes_at_two_in_the_morning() {
    let ny = "America/New_York";
    assert_eq!(
        local(ny, "2024-03-10T06:59:59Z"),
        "2024-03-10T01:59:59 -0500 -300"
    );
    assert_eq!(
        local(ny, "2024-03-10T07:00:00Z"),
        "2024-03-10T03:00:00 -0400 -240"
    );
    assert_eq!(
        local(ny, "2024-11-03T05:59:59Z"),
        "2024-11-03T01:59:59 -0400 -240"
    );
    assert_eq!(
        local(ny, "2024-11-03T06:00:00Z"),
        "2024-11-03T01:00:00 -0500 -300"
    );
    // Before the first transition (1883): local mean time, -4:56:02.
    assert_eq!(
        local(ny, "1800-01-01T00:00:00Z"),
        "1799-12-31T19:03:58 -0456 -296"
    );
}

#[test]
fn paris_lord_howe_and_kolkata() {
    let p = "Europe/Paris";
    assert_eq!(
        local(p, "2024-03-31T00:59:59Z"),
        "2024-03-31T01:59:59 +0100 60"
    );
    assert_eq!(
        local(p, "2024-03-31T01:00:00Z"),
        "2024-03-31T03:00:00 +0200 120"
    );
    assert_eq!(
        local(p, "2024-10-27T00:59:59Z"),
        "2024-10-27T02:59:59 +0200 120"
    );
    assert_eq!(
        local(p, "2024-10-27T01:00:00Z"),
        "2024-10-27T02:00:00 +0100 60"
    );
    // Lord Howe Island moves by thirty minutes.
    let h = "Australia/Lord_Howe";
    assert_eq!(
        local(h, "2024-10-05T15:29:59Z"),
        "2024-10-06T01:59:59 +1030 630"
    );
    assert_eq!(
        local(h, "2024-10-05T15:30:00Z"),
        "2024-10-06T02:30:00 +1100 660"
    );
    assert_eq!(
        local(h, "2024-04-06T14:59:59Z"),
        "2024-04-07T01:59:59 +1100 660"
    );
    assert_eq!(
        local(h, "2024-04-06T15:00:00Z"),
        "2024-04-07T01:30:00 +1030 630"
    );
    assert_eq!(
        local("Asia/Kolkata", "2024-06-01T00:00:00Z"),
        "2024-06-01T05:30:00 +0530 330"
    );
    // Before its first transition: local mean time, +5:53:28.
    assert_eq!(
        local("Asia/Kolkata", "1800-01-01T00:00:00Z"),
        "1800-01-01T05:53:28 +0553 353"
    );
}

#[test]
fn the_footer_rule_runs_after_the_last_transition() {
    let ny = "America/New_York";
    // Second Sunday of March 2100 is the 14th; last Sunday of October 2300 the 28th.
    assert_eq!(
        local(ny, "2100-03-14T06:59:59Z"),
        "2100-03-14T01:59:59 -0500 -300"
    );
    assert_eq!(
        local(ny, "2100-03-14T07:00:00Z"),
        "2100-03-14T03:00:00 -0400 -240"
    );
    let p = "Europe/Paris";
    assert_eq!(
        local(p, "2300-10-28T00:59:59Z"),
        "2300-10-28T02:59:59 +0200 120"
    );
    assert_eq!(
        local(p, "2300-10-28T01:00:00Z"),
        "2300-10-28T02:00:00 +0100 60"
    );
    // The instants really are past the file's transitions.
    let TimeZone::Named(z) = zone(ny) else {
        panic!("not a named zone")
    };
    let t = ms("2100-03-14T07:00:00Z") / 1000;
    assert!(z.period_at(t).since.is_some_and(|s| s == t));
}

#[test]
fn wall_time_in_a_gap_or_an_overlap() {
    let parts = |tz: &str, y: i32, m: i32, d: i32, h: i32, mi: i32| {
        eval(doc! {"$dateFromParts": {
            "year": y, "month": m, "day": d, "hour": h, "minute": mi, "timezone": tz,
        }})
        .unwrap()
    };
    let ny = "America/New_York";
    // Ordinary wall times.
    assert_eq!(parts(ny, 2024, 7, 1, 12, 0), date("2024-07-01T16:00:00Z"));
    assert_eq!(parts(ny, 2024, 1, 1, 12, 0), date("2024-01-01T17:00:00Z"));
    // 02:30 does not exist on 2024-03-10: read with EST, it is 03:30 EDT.
    assert_eq!(parts(ny, 2024, 3, 10, 2, 30), date("2024-03-10T07:30:00Z"));
    assert_eq!(parts(ny, 2024, 3, 10, 3, 30), date("2024-03-10T07:30:00Z"));
    assert_eq!(parts(ny, 2024, 3, 10, 1, 30), date("2024-03-10T06:30:00Z"));
    // 01:30 happens twice on 2024-11-03: the later, in EST.
    assert_eq!(parts(ny, 2024, 11, 3, 1, 30), date("2024-11-03T06:30:00Z"));
    assert_eq!(parts(ny, 2024, 11, 3, 0, 30), date("2024-11-03T04:30:00Z"));
    let p = "Europe/Paris";
    assert_eq!(parts(p, 2024, 3, 31, 2, 30), date("2024-03-31T01:30:00Z"));
    assert_eq!(parts(p, 2024, 10, 27, 2, 30), date("2024-10-27T01:30:00Z"));
    assert_eq!(parts(p, 2024, 7, 1, 12, 0), date("2024-07-01T10:00:00Z"));
    // $dateFromString reads a string without a zone as wall time in the zone.
    let from =
        |s: &str, tz: &str| eval(doc! {"$dateFromString": {"dateString": s, "timezone": tz}});
    assert_eq!(
        from("2024-07-01T12:00:00", p).unwrap(),
        date("2024-07-01T10:00:00Z")
    );
    assert_eq!(
        from("2024-07-01T12:00:00Z", p).unwrap_err().code,
        crate::value::error_codes::ErrorCode::ConversionFailure
    );
    // Every wall time round-trips through $dateToParts outside the changes.
    let z = zone("Australia/Lord_Howe");
    for utc in ["2024-01-15T03:04:05Z", "2024-06-15T03:04:05Z"] {
        let t = ms(utc);
        assert_eq!(z.wall_to_utc(z.local(t)), Some(t), "{utc}");
    }
}

#[test]
fn calendar_arithmetic_keeps_local_time() {
    let ny = "America/New_York";
    let add = |start: &str, unit: &str, amount: i32| {
        eval(doc! {"$dateAdd": {"startDate": date(start), "unit": unit, "amount": amount, "timezone": ny}})
            .unwrap()
    };
    // A day across the spring change keeps 07:00 local; an hour is an hour.
    assert_eq!(
        add("2024-03-09T12:00:00Z", "day", 1),
        date("2024-03-10T11:00:00Z")
    );
    assert_eq!(
        add("2020-11-01T05:50:02Z", "hour", 1),
        date("2020-11-01T06:50:02Z")
    );
    assert_eq!(
        add("2024-01-31T17:00:00Z", "month", 6),
        date("2024-07-31T16:00:00Z")
    );
    // Landing on a wall time that occurs twice, the daylight saving state of the start decides:
    // from summer the earlier (daylight) instant, from winter the later (standard) one.
    let add_in = |tz: &str, start: &str, amount: i32| {
        eval(doc! {"$dateAdd": {"startDate": date(start), "unit": "day", "amount": amount, "timezone": tz}})
            .unwrap()
    };
    assert_eq!(
        add_in(ny, "2024-11-02T05:30:00Z", 1),
        date("2024-11-03T05:30:00Z")
    );
    assert_eq!(
        add_in(ny, "2024-11-04T06:30:00Z", -1),
        date("2024-11-03T06:30:00Z")
    );
    assert_eq!(
        add_in("Europe/Paris", "2024-10-26T00:30:00Z", 1),
        date("2024-10-27T00:30:00Z")
    );
    assert_eq!(
        add_in("Europe/Paris", "2024-10-28T01:30:00Z", -1),
        date("2024-10-27T01:30:00Z")
    );
    let diff = |s: &str, e: &str, unit: &str| {
        eval(doc! {"$dateDiff": {"startDate": date(s), "endDate": date(e), "unit": unit, "timezone": ny}})
            .unwrap()
    };
    // 01:00 EST to 04:00 EDT is two hours; 23:00 to 00:00 local is a day.
    assert_eq!(
        diff("2024-03-10T06:00:00Z", "2024-03-10T08:00:00Z", "hour"),
        Bson::Int64(2)
    );
    assert_eq!(
        diff("2024-03-10T04:00:00Z", "2024-03-10T05:00:00Z", "day"),
        Bson::Int64(1)
    );
    let trunc = |d: &str, unit: &str, tz: &str| {
        eval(doc! {"$dateTrunc": {"date": date(d), "unit": unit, "timezone": tz}}).unwrap()
    };
    assert_eq!(
        trunc("2024-07-01T23:30:00Z", "day", "Europe/Paris"),
        date("2024-07-01T22:00:00Z")
    );
    assert_eq!(
        trunc("2024-03-10T12:00:00Z", "day", ny),
        date("2024-03-10T05:00:00Z")
    );
    assert_eq!(
        eval(doc! {"$hour": {"date": date("2024-03-10T07:00:00Z"), "timezone": ny}}).unwrap(),
        Bson::Int32(3)
    );
    assert_eq!(
        eval(doc! {"$dateToParts": {"date": date("2024-10-05T15:30:00Z"), "timezone": "Australia/Lord_Howe"}})
            .unwrap(),
        Bson::Document(
            doc! {"year": 2024, "month": 10, "day": 6, "hour": 2, "minute": 30, "second": 0, "millisecond": 0}
        )
    );
    // Without a format, a named zone's string has no `Z`.
    assert_eq!(
        eval(doc! {"$dateToString": {"date": date("2024-07-01T10:00:00Z"), "timezone": "Europe/Paris"}})
            .unwrap(),
        Bson::String("2024-07-01T12:00:00.000".into())
    );
}

#[test]
fn bad_names_are_40485_without_touching_other_files() {
    let long = "A".repeat(10 * 1024);
    for name in [
        "../etc/passwd",
        "../../../../etc/passwd",
        "/etc/passwd",
        "Nowhere/City",
        long.as_str(),
        "Europe//Paris",
        "Europe/Paris/",
        "Europe/./Paris",
        "Europe/Paris\0",
        "Europe\\Paris",
        "+a\u{e9}1",
        "-1\u{e9}",
        "+\u{e9}:1",
        "",
        "zone.tab",
        "Europe",
    ] {
        let e = time_zone(Some(Bson::String(name.into()))).unwrap_err();
        assert_eq!(e.code.0, 40485, "{name}");
        assert_eq!(
            e.message,
            format!("unrecognized time zone identifier: \"{name}\"")
        );
    }
    for name in [
        "../etc/passwd",
        "/etc/passwd",
        "a/../b",
        "a b",
        long.as_str(),
    ] {
        assert!(!valid_name(name), "{name}");
    }
    assert!(valid_name("America/Argentina/Buenos_Aires"));
    assert!(valid_name("Etc/GMT+5"));
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("tzif-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn files_outside_the_zone_directory_are_not_read() {
    let paris = std::fs::read(zone_dir().join("Europe/Paris")).unwrap();
    let root = Scratch::new("root");
    let outside = Scratch::new("outside");
    let dir = root.0.join("zones");
    std::fs::create_dir_all(dir.join("Inside")).unwrap();
    std::fs::write(dir.join("Inside/Paris"), &paris).unwrap();
    // A valid TZif file beside the zone directory, and a link to it from inside.
    std::fs::write(root.0.join("Secret"), &paris).unwrap();
    std::fs::write(outside.0.join("Paris"), &paris).unwrap();
    std::os::unix::fs::symlink(outside.0.join("Paris"), dir.join("Link")).unwrap();
    std::os::unix::fs::symlink(&outside.0, dir.join("LinkDir")).unwrap();
    std::os::unix::fs::symlink(dir.join("Inside/Paris"), dir.join("Alias")).unwrap();
    std::fs::write(dir.join("Text"), b"not a zone\n").unwrap();
    std::fs::write(dir.join("Short"), &paris[..100]).unwrap();
    assert!(read_zone(&dir, "Inside/Paris").is_some());
    assert!(
        read_zone(&dir, "Alias").is_some(),
        "links inside are followed"
    );
    for name in [
        "../Secret",
        "Link",
        "LinkDir/Paris",
        "Text",
        "Short",
        "Inside",
        "Missing",
    ] {
        assert!(read_zone(&dir, name).is_none(), "{name}");
    }
    // The same bytes are a zone where they may be read.
    assert!(read_zone(&outside.0, "Paris").is_some());
}

#[test]
fn the_cache_is_bounded() {
    let dir = zone_dir();
    let mut names = Vec::new();
    for area in ["America", "Europe", "Asia", "Africa"] {
        for e in std::fs::read_dir(dir.join(area)).unwrap().flatten() {
            if e.file_type().is_ok_and(|t| t.is_file()) {
                names.push(format!("{area}/{}", e.file_name().to_string_lossy()));
            }
        }
    }
    assert!(names.len() > MAX_CACHED, "{} zones", names.len());
    for n in &names {
        let _ = named(n);
        assert!(cache().lock().unwrap().len() <= MAX_CACHED);
    }
    // Names that do not exist are not kept.
    let before = cache().lock().unwrap().len();
    for i in 0..50 {
        assert!(named(&format!("Nowhere/City{i}")).is_none());
    }
    assert!(cache().lock().unwrap().len() <= before.max(MAX_CACHED));
    assert!(!cache()
        .lock()
        .unwrap()
        .keys()
        .any(|k| k.starts_with("Nowhere/")));
}

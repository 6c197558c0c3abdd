//! The replica-set core's client-visible messages, printed with the project's own value
//! printer (the one phase 2 lends the core): read-preference errors, the selection timeout and
//! merged write-concern errors, word for word as mongos 8.0 writes them.

use std::time::{Duration, Instant};

use bson::{doc, Bson};
use sluice::backend::topology::write_concern::{
    merge_write_concern_errors, ShardWriteConcernError,
};
use sluice::backend::topology::{
    Hello, MemberWait, Need, Now, Printer, ReadPreference, SeedList, ShardTopology,
    TopologySettings, WaitStep,
};
use sluice::value::field::type_name;
use sluice::value::render::{render_doc, render_value};

const PRINTER: Printer = Printer {
    document: render_doc,
    value: render_value,
    type_name,
};

fn parse_error(rp: Bson) -> (i32, String) {
    let e = ReadPreference::from_bson(&rp, &PRINTER).unwrap_err();
    (e.code.0, e.message)
}

#[test]
fn read_preference_errors_name_types_and_values_as_mongos_does() {
    assert_eq!(
        parse_error(Bson::String("secondary".into())),
        (
            14,
            "$readPreference has incorrect type: expected object but got string".into()
        )
    );
    assert_eq!(
        parse_error(doc! {"mode": 1}.into()),
        (
            14,
            "\"mode\" had the wrong type. Expected string, found int".into()
        )
    );
    assert_eq!(
        parse_error(doc! {"mode": "secondary", "tags": {"dc": "east"}}.into()),
        (
            14,
            "\"tags\" had the wrong type. Expected array, found object".into()
        )
    );
    assert_eq!(
        parse_error(doc! {"mode": "nearest", "hedge": 1}.into()),
        (
            14,
            "hedge field must be of type object if provided; found hedge: 1".into()
        )
    );
    assert_eq!(
        parse_error(doc! {"mode": "nearest", "hedge": {"enabled": 1}}.into()),
        (
            14,
            "BSON field 'hedge.enabled' is the wrong type 'int', expected type 'bool'".into()
        )
    );
    assert_eq!(
        parse_error(doc! {"mode": "secondary", "maxStalenessSeconds": 90.5}.into()),
        (
            2,
            "Expected field \"maxStalenessSeconds\" to have a value exactly representable as a \
             64-bit integer, but found maxStalenessSeconds: 90.5"
                .into()
        )
    );
    assert_eq!(
        parse_error(doc! {"mode": "secondary", "maxStalenessSeconds": "90"}.into()),
        (
            14,
            "Expected field \"maxStalenessSeconds\" to have numeric type, but found string".into()
        )
    );
}

fn topology() -> ShardTopology {
    let mut t = ShardTopology::new(
        &SeedList::parse("rs0/a:27018,b:27018").unwrap(),
        TopologySettings::default(),
    );
    let now = Now {
        instant: Instant::now(),
        wall_ms: 1_700_000_000_000,
    };
    let secondary = doc! {
        "ok": 1, "setName": "rs0", "secondary": true, "hosts": ["a:27018", "b:27018"],
        "me": "a:27018",
    };
    t.on_hello(
        &"a:27018".parse().unwrap(),
        Hello::from_document(&secondary),
        Some(Duration::from_millis(1)),
        now,
    );
    t
}

#[test]
fn the_selection_timeout_prints_the_read_preference_and_the_set() {
    let t = topology();
    let start = Instant::now();
    let gave_up = |need: Need| -> (i32, String) {
        let wait = MemberWait::new(need, start, t.settings(), None);
        match wait.step(&t, start + Duration::from_secs(15), 0, &PRINTER) {
            WaitStep::GiveUp(e) => (e.code.0, e.message),
            other => panic!("expected to give up, got {other:?}"),
        }
    };
    assert_eq!(
        gave_up(Need::Write),
        (
            133,
            "Could not find host matching read preference { mode: \"primary\" } for set rs0".into()
        )
    );
    let rp = ReadPreference::from_document(
        &doc! {"mode": "secondary", "tags": [{"dc": "east"}], "maxStalenessSeconds": 120},
        &PRINTER,
    )
    .unwrap();
    assert_eq!(
        gave_up(Need::Read(rp)),
        (
            133,
            "Could not find host matching read preference { mode: \"secondary\", tags: [ { dc: \
             \"east\" } ], maxStalenessSeconds: 120 } for set rs0"
                .into()
        )
    );
    // Before the deadline, no primary is a reason to wait, not an error.
    let wait = MemberWait::new(Need::Write, start, t.settings(), None);
    assert!(matches!(
        wait.step(&t, start, 0, &PRINTER),
        WaitStep::Wait { .. }
    ));
}

#[test]
fn merged_write_concern_errors_print_their_details() {
    let timeout = |shard: &str| {
        ShardWriteConcernError::from_document(
            shard,
            &doc! {
                "code": 64, "codeName": "WriteConcernFailed",
                "errmsg": "waiting for replication timed out",
                "errInfo": {"wtimeout": true, "writeConcern": {"w": 3, "wtimeout": 100, "provenance": "clientSupplied"}},
            },
        )
        .unwrap()
    };
    let one = merge_write_concern_errors(&[timeout("shard01")], &PRINTER).unwrap();
    assert_eq!(
        one.get_str("errmsg").unwrap(),
        "WriteConcernFailed: waiting for replication timed out; Error details: { wtimeout: true, \
         writeConcern: { w: 3, wtimeout: 100, provenance: \"clientSupplied\" } } at shard01"
    );
    let two =
        merge_write_concern_errors(&[timeout("shard01"), timeout("shard02")], &PRINTER).unwrap();
    assert_eq!(two.get_i32("code").unwrap(), 64);
    assert_eq!(
        two.get_str("errmsg").unwrap(),
        "Multiple errors reported :: WriteConcernFailed: waiting for replication timed out; \
         Error details: { wtimeout: true, writeConcern: { w: 3, wtimeout: 100, provenance: \
         \"clientSupplied\" } } at shard01 :: and :: WriteConcernFailed: waiting for replication \
         timed out; Error details: { wtimeout: true, writeConcern: { w: 3, wtimeout: 100, \
         provenance: \"clientSupplied\" } } at shard02"
    );
}

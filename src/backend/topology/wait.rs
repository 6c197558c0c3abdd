//! Waiting for a member to serve a request — a primary after a failover, an eligible
//! secondary — without I/O: [`MemberWait::step`] looks at the topology and says "send it to
//! this member", "wait until the topology changes or this instant", or "give up with this
//! error".
//!
//! As mongos's `getHostOrRefresh`: selection is tried at once; when it finds nothing the
//! caller asks the monitors to check now (`ShardTopology::request_immediate_check`) and waits
//! for a topology change, at most [`TopologySettings::find_host_timeout`] (15 s) or until the
//! operation's own deadline (`maxTimeMS`), whichever comes first. Giving up at the selection
//! timeout is FailedToSatisfyReadPreference (133), `Could not find host matching read
//! preference { mode: "primary" } for set rs0`; giving up at the operation's deadline is
//! MaxTimeMSExpired (50), `operation exceeded time limit`, as an operation interrupted by its
//! `maxTimeMS` reports.

use std::time::Instant;

use crate::value::error_codes::ErrorCode;

use super::address::HostAddr;
use super::error::{Printer, TopologyError};
use super::read_preference::ReadPreference;
use super::select::{select_for_read, select_for_write};
use super::state::{ShardTopology, TopologySettings};

/// What the request needs a member for.
#[derive(Debug, Clone, PartialEq)]
pub enum Need {
    /// A write (or a primary-only command): the primary.
    Write,
    /// A read with this read preference.
    Read(ReadPreference),
}

/// One wait for a member, with its deadline fixed when it starts.
#[derive(Debug, Clone)]
pub struct MemberWait {
    need: Need,
    deadline: Instant,
    bounded_by_operation: bool,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitStep {
    /// Send the request to this member.
    Ready(HostAddr),
    /// No member serves it yet: request an immediate check, then wait until the topology's
    /// `version()` is greater than `seen_version` or `until` passes, and step again.
    Wait {
        /// The topology version this step looked at.
        seen_version: u64,
        /// Step again at this instant at the latest.
        until: Instant,
    },
    /// Fail the request with this error.
    GiveUp(TopologyError),
}

impl MemberWait {
    /// Starts waiting at `now` for a member that serves `need`; `operation_deadline` is the
    /// request's own (from `maxTimeMS`), if any.
    pub fn new(
        need: Need,
        now: Instant,
        settings: &TopologySettings,
        operation_deadline: Option<Instant>,
    ) -> Self {
        let own = now + settings.find_host_timeout;
        match operation_deadline {
            Some(d) if d < own => MemberWait {
                need,
                deadline: d,
                bounded_by_operation: true,
            },
            _ => MemberWait {
                need,
                deadline: own,
                bounded_by_operation: false,
            },
        }
    }

    /// When this wait gives up.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Looks at the topology at `now`; `random` picks among equally eligible readers.
    pub fn step(
        &self,
        topology: &ShardTopology,
        now: Instant,
        random: u64,
        printer: &Printer,
    ) -> WaitStep {
        let selected = match &self.need {
            Need::Write => Ok(select_for_write(topology)),
            Need::Read(pref) => select_for_read(topology, pref, random),
        };
        match selected {
            Err(e) => WaitStep::GiveUp(e),
            Ok(Some(member)) => WaitStep::Ready(member),
            Ok(None) if now >= self.deadline => {
                WaitStep::GiveUp(self.timeout_error(topology, printer))
            }
            Ok(None) => WaitStep::Wait {
                seen_version: topology.version(),
                until: self.deadline,
            },
        }
    }

    fn timeout_error(&self, topology: &ShardTopology, printer: &Printer) -> TopologyError {
        if self.bounded_by_operation {
            return TopologyError::new(
                ErrorCode::MaxTimeMSExpired,
                "operation exceeded time limit",
            );
        }
        let pref = match &self.need {
            Need::Write => ReadPreference::primary(),
            Need::Read(p) => p.clone(),
        };
        TopologyError::new(
            ErrorCode::FailedToSatisfyReadPreference,
            format!(
                "Could not find host matching read preference {} for set {}",
                (printer.document)(&pref.to_document()),
                topology.display_name()
            ),
        )
    }
}

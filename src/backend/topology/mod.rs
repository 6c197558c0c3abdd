//! The replica-set core of a shard: discovery, monitoring decisions, server selection,
//! waiting for a primary, and the failover rules of the write path — sans-IO. Nothing here
//! opens a socket, spawns a task or reads a clock: events and the time come in as arguments,
//! decisions go out as values, so every rule is tested without a network. The tokio side
//! (monitors, per-member pools, the write executor's resend) drives it; see
//! `docs/design/replica-sets.md`.
//!
//! - [`address`]: member addresses and seed lists (`"rs0/h1:27018,h2:27018"`, `"h:27018"`).
//! - [`hello`]: a member's `hello` reply, read into its server type, members, election and
//!   topology versions, last write date and tags.
//! - [`state`]: [`ShardTopology`], the state machine of one shard's members.
//! - [`read_preference`]: `$readPreference` parsed and validated as mongos does.
//! - [`select`]: which member serves a write and which a read.
//! - [`wait`]: waiting for that member, bounded by the selection timeout or `maxTimeMS`.
//! - [`retry`]: which failures mark a member, which make a child batch resendable, and which
//!   labels the client sees.
//! - [`write_concern`]: `writeConcernError`s of several child batches merged into one.
//! - [`error`]: the error type and the value printer the caller lends.
//!
//! The core imports nothing from the crate but the error-code table. One module is the I/O
//! around it:
//!
//! - [`monitor`]: [`ShardMonitor`], a tokio task per member that connects, runs `hello`
//!   (awaitable where the member offers it), feeds the replies and failures into the
//!   [`ShardTopology`] and publishes its version on a `watch` channel; members discovered get
//!   a monitor, members removed lose theirs. It uses the backend's shard connection.

pub mod address;
pub mod error;
pub mod hello;
pub mod monitor;
pub mod read_preference;
pub mod retry;
pub mod select;
pub mod state;
pub mod wait;
pub mod write_concern;

#[cfg(test)]
mod tests;

pub use address::{HostAddr, SeedList};
pub use error::{Printer, TopologyError};
pub use hello::{Hello, ServerType, TopologyVersion};
pub use monitor::{MonitorCounts, MonitorOptions, ShardMonitor};
pub use read_preference::{ReadPreference, ReadPreferenceMode};
pub use state::{
    ApplicationError, CheckKind, CheckPlan, ElectionIdSetVersion, Member, MonitorError, Now,
    ShardTopology, TopologyKind, TopologySettings, Update,
};
pub use wait::{MemberWait, Need, WaitStep};

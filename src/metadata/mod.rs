//! Where routing metadata comes from, behind one trait, [`MetadataSource`]: the `config.*`
//! documents (shards, databases, sharded collections and their chunks) the router routes by.
//!
//! - [`static_store`]: the [`StaticStore`], metadata the router holds itself (`--config`,
//!   `sluice demo`), persisted atomically, changed by the router's sharding administration and
//!   serving clients' reads of the `config` database on the document engine.
//! - [`configsvr`]: MongoDB's config server as the source (`--configdb`), with its catalog
//!   cache; the second implementation of the trait.
//! - [`source`]: the trait; [`error`]: the error both report.
//!
//! `docs/design/routing-metadata.md` describes both.

pub mod configsvr;
pub mod error;
pub mod source;
pub mod static_store;

pub use error::MetadataError;
pub use source::{CollectionRead, MetadataSource, Since};
pub use static_store::StaticStore;

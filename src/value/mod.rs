//! BSON helpers every layer shares, and nothing that knows about commands, shards or sockets.
//!
//! - [`compare`]: MongoDB's cross-type comparison order (`canonical_type`, `compare`,
//!   `values_equal`, the `OrdBson` key for ordered sets and maps).
//! - [`decimal`]: IEEE 754-2008 decimal128 arithmetic (`Dec`), as mongod computes whenever an
//!   operand is a `NumberDecimal`.
//! - [`render`]: values written the way mongod writes them into error messages.
//! - [`field`]: typed readers, one of each: `truthy`, `is_number`, `to_f64`, `number_field`,
//!   `type_name`, and the cursor-id generator.
//! - [`error_codes`]: the MongoDB error codes and their `codeName`s.

pub mod compare;
pub mod decimal;
pub mod error_codes;
pub mod field;
pub mod render;

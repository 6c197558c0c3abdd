//! The catalog cache as the router's routing source (`--configdb`): the routing table asks it
//! for a namespace's snapshot on every lookup (a cached one is answered without waiting) and
//! hands it the stale errors shards answer with, which become the refreshes they ask for.

use std::sync::Arc;

use bson::Document;

use crate::backend::topology::Printer;
use crate::routing::{RoutingError, RoutingSnapshot, RoutingSource};
use crate::value::error_codes::ErrorCode;

use super::cache::CatalogCache;
use super::error::MetadataError;
use super::stale::StaleError;

/// [`CatalogCache`] behind the routing table's [`RoutingSource`].
#[derive(Debug, Clone)]
pub struct CatalogRouting {
    cache: CatalogCache,
    printer: Printer,
}

impl CatalogRouting {
    /// The routing source over `cache`; `printer` renders values in error messages.
    pub fn new(cache: CatalogCache, printer: Printer) -> Self {
        CatalogRouting { cache, printer }
    }

    /// The cache itself (databases, shards, counters).
    pub fn cache(&self) -> &CatalogCache {
        &self.cache
    }
}

/// A metadata error as the routing layer reports it (same code, same message).
pub fn routing_error(e: MetadataError) -> RoutingError {
    RoutingError::new(e.code, e.message)
}

impl RoutingSource for CatalogRouting {
    fn snapshot<'a>(
        &'a self,
        ns: &'a str,
    ) -> crate::routing::table::BoxFuture<'a, Result<Option<Arc<RoutingSnapshot>>, RoutingError>>
    {
        Box::pin(async move {
            match self.cache.routing_info(ns).await {
                Ok(info) => Ok(info.collection.map(|c| c.snapshot.clone())),
                // A database that does not exist has no sharded collection: the command goes
                // on to the database-level handling, which creates or refuses it.
                Err(e) if e.code == ErrorCode::NamespaceNotFound => Ok(None),
                Err(e) => Err(routing_error(e)),
            }
        })
    }

    fn stale(&self, ns: &str, errors: &[Document]) {
        let mut applied = false;
        for e in errors {
            if let Some(stale) = StaleError::from_error(e, &self.printer) {
                for action in stale.actions(ns) {
                    self.cache.apply(&action);
                    applied = true;
                }
            }
        }
        if !applied {
            self.cache.on_stale_collection(ns, None);
        }
    }

    fn flush(&self) {
        self.cache.flush_all();
    }
}

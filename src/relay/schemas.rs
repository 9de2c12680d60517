//! Rows of topics with a schema: the topic's schema looked up once per batch, each row's JSON
//! encoded and framed before it is handed to librdkafka (`send.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::schemas::{Compiled, SchemaError};

use super::*;

/// Each topic's schema for one batch (`Ok(None)`: plain JSON).
pub(super) type Codecs = HashMap<String, Result<Option<Arc<Compiled>>, SchemaError>>;

impl Relay {
    /// The schema of each topic of a batch that has one.
    pub(super) async fn codecs(&self, topics: &HashSet<&str>) -> Codecs {
        let mut out = Codecs::new();
        let Some(schemas) = &self.config.schemas else {
            return out;
        };
        for t in topics {
            if schemas.topic(t).is_some() {
                let got = schemas.for_topic(t).await;
                match &got {
                    Err(e) if e.is_unavailable() => self.outages.registry.failed(e),
                    _ => self.outages.registry.ok(),
                }
                out.insert((*t).to_owned(), got);
            }
        }
        out
    }

    /// The row's payload in its topic's format (`None`: send the stored JSON as it is), or
    /// the row's fate when it cannot be encoded.
    pub(super) fn encode_row(&self, codecs: &Codecs, row: &Row) -> Result<Option<Vec<u8>>, Fate> {
        let Some(codec) = codecs.get(row.topic()) else {
            return Ok(None);
        };
        let compiled = match codec {
            Ok(Some(c)) => c,
            Ok(None) => return Ok(None),
            Err(e) if e.is_unavailable() => return Err(Fate::Waiting(e.to_string())),
            Err(e) => {
                return Err(Fate::Refused(
                    crate::wire::cut(&e.to_string()),
                    RefusalReason::Schema,
                ))
            }
        };
        let Some(text) = row.payload() else {
            // A tombstone stays a null value in every format.
            return Ok(None);
        };
        compiled.encode_text(text).map(Some).map_err(|e| {
            Fate::Refused(
                crate::wire::cut(&format!("schema id {}: {e}", compiled.id)),
                RefusalReason::Contract,
            )
        })
    }
}

//! Framed records (the Confluent wire format) decoded through the schema registry before any
//! handler sees them: `record.rs` leaves their body empty; the message task fills it in here.

use super::envelope::Envelope;
use super::Shared;
#[cfg(feature = "schemas")]
use crate::backoff::Backoff;

/// The dependency name a registry outage opens the shared breaker under.
pub const REGISTRY_DEPENDENCY: &str = "schema-registry";

/// Decodes every framed record of `envs`. A record that cannot be decoded becomes a decode
/// failure (dead-lettered by `process`, naming the registry's error); while the registry is
/// unreachable the task waits with backoff, spending nothing, and — with a breaker configured —
/// after the breaker's in-place attempts opens it for every replica under
/// [`REGISTRY_DEPENDENCY`] (their intake paused; the held records are not parked, so no
/// dead letter is written). False when shutdown came first:
/// the messages are abandoned (their offsets stay before them).
#[cfg_attr(not(feature = "schemas"), allow(unused_variables))]
pub(super) async fn resolve(envs: &mut [&mut Envelope], shared: &Shared) -> bool {
    for env in envs.iter_mut() {
        let Ok(d) = &mut env.decoded else { continue };
        let Some(id) = d.schema_id.filter(|_| !d.tombstone && d.body.is_null()) else {
            continue;
        };
        #[cfg(feature = "schemas")]
        let Some(schemas) = &shared.config.schemas
        else {
            env.decoded = Err(format!(
                "framed payload (schema id {id}) but the consumer has no schema registry configured"
            ));
            continue;
        };
        #[cfg(not(feature = "schemas"))]
        {
            env.decoded = Err(format!(
                "framed payload (schema id {id}): built without the schemas feature"
            ));
            continue;
        }
        #[cfg(feature = "schemas")]
        {
            let mut outage = Backoff::default();
            let mut failures = 0u32;
            loop {
                match schemas.decode(&d.payload).await {
                    Ok(decoded) => {
                        shared.registry_outage.ok();
                        d.body = decoded.json;
                        break;
                    }
                    Err(e) if e.is_unavailable() => {
                        super::stats::ConsumerStats::inc(&shared.stats.registry_waits);
                        shared
                            .registry_outage
                            .failed(&format!("holding framed messages until it is back: {e}"));
                        failures += 1;
                        if let Some(b) = shared.breaker() {
                            if failures >= b.config.attempts && !b.is_open(REGISTRY_DEPENDENCY) {
                                b.open(REGISTRY_DEPENDENCY, &e.to_string()).await;
                            }
                        }
                        tokio::select! {
                            () = shared.cancel.cancelled() => return false,
                            () = tokio::time::sleep(outage.next_delay()) => {}
                        }
                    }
                    Err(e) => {
                        shared.registry_outage.ok();
                        env.decoded = Err(format!("schema id {id}: {e}"));
                        break;
                    }
                }
            }
        }
    }
    true
}

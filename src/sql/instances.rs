//! `outbox_instances`: the heartbeats of relays, consumer replicas and archivers. `{s}` stands
//! for the quoted schema.

/// One heartbeat: (`$1` kind, `$2` name, `$3` instance) is alive now with state `$4`.
pub(crate) const BEAT: &str = "INSERT INTO {s}.outbox_instances (kind, name, instance, state)
 VALUES ($1, $2, $3, $4)
 ON CONFLICT (kind, name, instance) DO UPDATE SET seen_at = now(), state = excluded.state";

/// (`$1` kind, `$2` name, `$3` instance) stopped cleanly: not alive from now on, not "gone".
pub(crate) const STOPPED: &str = "UPDATE {s}.outbox_instances
    SET state = coalesce(state, '{}'::jsonb) || '{\"stopped\": true}'::jsonb, seen_at = now()
  WHERE kind = $1 AND name = $2 AND instance = $3";

/// Rows of processes gone for a day.
pub(crate) const FORGET: &str =
    "DELETE FROM {s}.outbox_instances WHERE seen_at < now() - interval '1 day'";

/// Every instance seen in the last hour, with how long ago: the overview.
/// The dependencies replicas of consumer group `$1` declared in a heartbeat within the hour
/// (`NULL` rows when a replica declares none), one row per replica at least.
pub(crate) const DECLARED: &str = "SELECT d.name
   FROM {s}.outbox_instances i
   LEFT JOIN LATERAL jsonb_array_elements_text(
        CASE WHEN jsonb_typeof(i.state->'dependencies') = 'array' THEN i.state->'dependencies'
             ELSE '[]'::jsonb END) AS d(name) ON true
  WHERE i.kind = 'consumer' AND i.name = $1 AND i.seen_at > now() - interval '1 hour'";

/// Consumer groups with a heartbeat within the hour.
pub(crate) const GROUPS: &str = "SELECT DISTINCT name FROM {s}.outbox_instances
  WHERE kind = 'consumer' AND seen_at > now() - interval '1 hour' ORDER BY 1";

pub(crate) const RECENT: &str = "SELECT kind, name, instance, state,
        extract(epoch FROM now() - seen_at)::float8, started_at
   FROM {s}.outbox_instances WHERE seen_at > now() - interval '1 hour'
  ORDER BY kind, name, instance";

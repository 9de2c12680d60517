//! Bearer-token authentication and roles for the admin API.
//!
//! Tokens are never stored: the server keeps SHA-256 digests and compares the digest of the
//! presented token with every known digest in constant time (no early exit, no length leak).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// What a token holder may do. Ordered: each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read everything except message contents (bodies and header values are redacted).
    Viewer,
    /// Also replay, drop, requeue, and pause/resume/cancel their own replay jobs.
    Operator,
    /// Also purge the archive and act on other holders' jobs.
    Admin,
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "viewer" => Ok(Self::Viewer),
            "operator" => Ok(Self::Operator),
            "admin" => Ok(Self::Admin),
            // The value is not echoed: a token pasted into the wrong column would be.
            _ => Err("unknown role: expected viewer, operator or admin".into()),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Viewer => "viewer",
            Self::Operator => "operator",
            Self::Admin => "admin",
        })
    }
}

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Caller {
    /// The token holder's name (recorded as the actor in audit rows).
    pub holder: String,
    /// Their role.
    pub role: Role,
}

struct Entry {
    holder: String,
    role: Role,
    digest: [u8; 32],
}

/// The known tokens, or no authentication at all (explicitly asked for).
pub struct Auth {
    entries: Vec<Entry>,
    insecure: bool,
}

impl fmt::Debug for Auth {
    // Never prints digests.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("tokens", &self.entries.len())
            .field("insecure", &self.insecure)
            .finish()
    }
}

/// The shortest token accepted (and hashed by `outbox hash-token`).
pub const MIN_TOKEN_CHARS: usize = 16;

/// SHA-256 of a token, lowercase hex: what a tokens file stores.
pub fn token_hash(token: &str) -> String {
    openssl::sha::sha256(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Tokens that cannot be used: the server does not start with them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// `OUTBOX_ADMIN_TOKEN` is shorter than [`MIN_TOKEN_CHARS`].
    #[error("OUTBOX_ADMIN_TOKEN must be at least {MIN_TOKEN_CHARS} characters")]
    ShortToken,
    /// A tokens file line that does not parse (the line's content is never echoed).
    #[error("tokens file line {line}: {reason}")]
    Line {
        /// Its number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A tokens file with no token in it.
    #[error("tokens file has no tokens")]
    NoTokens,
}

impl Auth {
    /// No authentication: every request is `admin` holder `anonymous`.
    pub fn insecure() -> Self {
        Self {
            entries: Vec::new(),
            insecure: true,
        }
    }

    /// One token, holder `admin`, role admin (`OUTBOX_ADMIN_TOKEN`).
    ///
    /// # Errors
    /// [`AuthError::ShortToken`] for a token shorter than [`MIN_TOKEN_CHARS`].
    pub fn single(token: &str) -> Result<Self, AuthError> {
        // A request's token is trimmed before it is checked: so is this one.
        let token = token.trim();
        if token.chars().count() < MIN_TOKEN_CHARS {
            return Err(AuthError::ShortToken);
        }
        Ok(Self {
            entries: vec![Entry {
                holder: "admin".into(),
                role: Role::Admin,
                digest: openssl::sha::sha256(token.as_bytes()),
            }],
            insecure: false,
        })
    }

    /// A tokens file: one token per line, `HOLDER ROLE SHA256HEX` (see [`token_hash`]); blank
    /// lines and `#` comments ignored.
    ///
    /// # Errors
    /// [`AuthError::Line`] for a line that does not parse, naming its number (never echoing a
    /// hash); [`AuthError::NoTokens`] for a file without one.
    pub fn from_file_text(text: &str) -> Result<Self, AuthError> {
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parts: Vec<&str> = line.split_whitespace().collect();
            let [holder, role, hash] = parts.as_slice() else {
                return Err(AuthError::Line {
                    line: n + 1,
                    reason: "expected HOLDER ROLE SHA256HEX".into(),
                });
            };
            let role: Role = role.parse().map_err(|e| AuthError::Line {
                line: n + 1,
                reason: e,
            })?;
            let hash = hash.strip_prefix("sha256:").unwrap_or(hash);
            let digest =
                parse_hex32(&hash.to_ascii_lowercase()).ok_or_else(|| AuthError::Line {
                    line: n + 1,
                    reason: "the hash must be 64 hex digits (sha256 of the token)".into(),
                })?;
            entries.push(Entry {
                holder: (*holder).to_owned(),
                role,
                digest,
            });
        }
        if entries.is_empty() {
            return Err(AuthError::NoTokens);
        }
        Ok(Self {
            entries,
            insecure: false,
        })
    }

    /// Whether requests are accepted without a token.
    pub fn is_insecure(&self) -> bool {
        self.insecure
    }

    /// The caller a bearer token belongs to.
    pub fn check(&self, token: Option<&str>) -> Option<Caller> {
        if self.insecure {
            return Some(Caller {
                holder: "anonymous".into(),
                role: Role::Admin,
            });
        }
        let digest = openssl::sha::sha256(token?.as_bytes());
        // Compare against every entry, always: the time does not depend on which one matches.
        let mut found: Option<&Entry> = None;
        for e in &self.entries {
            if openssl::memcmp::eq(&digest, &e.digest) && found.is_none() {
                found = Some(e);
            }
        }
        found.map(|e| Caller {
            holder: e.holder.clone(),
            role: e.role,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_file_roles_and_checks() {
        let text = format!(
            "# holder role hash\nvera viewer {}\nolga operator sha256:{}\n",
            token_hash("viewer-token-123456"),
            token_hash("operator-token-123456")
        );
        let a = Auth::from_file_text(&text).unwrap();
        assert_eq!(
            a.check(Some("viewer-token-123456")),
            Some(Caller {
                holder: "vera".into(),
                role: Role::Viewer
            })
        );
        assert_eq!(
            a.check(Some("operator-token-123456")).unwrap().role,
            Role::Operator
        );
        assert_eq!(a.check(Some("nope")), None);
        assert_eq!(a.check(None), None);
        assert!(Auth::from_file_text("x admin nothex").is_err());
        assert!(Auth::from_file_text("x boss 00")
            .unwrap_err()
            .to_string()
            .contains("unknown role"));
        assert!(Auth::single("short").is_err());
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
    }
}

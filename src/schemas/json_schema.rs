//! JSON Schema: the payload stays JSON on the wire (framed); the schema validates it. A
//! schema without `$schema` is read as draft 7 (what Confluent's serializers assume); remote
//! `$ref`s are never fetched.

use super::SchemaError;

/// A compiled JSON Schema.
pub(crate) struct JsonSchema {
    validator: jsonschema::Validator,
    title: Option<String>,
}

impl std::fmt::Debug for JsonSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonSchema")
            .field("title", &self.title)
            .finish()
    }
}

impl JsonSchema {
    /// Compiles a JSON Schema document.
    pub(crate) fn parse(text: &str) -> Result<Self, SchemaError> {
        let doc: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| SchemaError::Schema(format!("json schema is not JSON: {e}")))?;
        let mut o = jsonschema::options();
        if doc.get("$schema").is_none() {
            o = o.with_draft(jsonschema::Draft::Draft7);
        }
        let validator = o
            .build(&doc)
            .map_err(|e| SchemaError::Schema(format!("json schema: {e}")))?;
        Ok(Self {
            title: doc.get("title").and_then(|t| t.as_str()).map(str::to_owned),
            validator,
        })
    }

    /// The schema's `title` (record naming).
    pub(crate) fn record_name(&self) -> Option<String> {
        self.title.clone()
    }

    /// Checks `json`; the first few violations, each with where it is.
    pub(crate) fn validate(&self, json: &serde_json::Value) -> Result<(), SchemaError> {
        let errors: Vec<String> = self
            .validator
            .iter_errors(json)
            .take(3)
            .map(|e| {
                let at = e.instance_path().to_string();
                if at.is_empty() {
                    e.to_string()
                } else {
                    format!("{at}: {e}")
                }
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(SchemaError::Invalid(errors.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn validates_with_paths() {
        let s = JsonSchema::parse(
            r#"{"title": "OrderCreated", "type": "object", "required": ["order_id"],
                "properties": {"order_id": {"type": "string"}, "total_cents": {"type": "integer", "minimum": 0}},
                "additionalProperties": false}"#,
        )
        .unwrap();
        assert_eq!(s.record_name().as_deref(), Some("OrderCreated"));
        s.validate(&json!({"order_id": "A", "total_cents": 5}))
            .unwrap();
        let e = s
            .validate(&json!({"total_cents": -1}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("order_id") && e.contains("/total_cents"), "{e}");
        assert!(matches!(
            JsonSchema::parse("{\"type\": 5}"),
            Err(SchemaError::Schema(_))
        ));
    }
}

//! Values rendered the way mongod writes them into error messages
//! (`E11000 duplicate key error … dup key: { _id: 1 }`).

use bson::{Bson, Document};

/// Renders a document as `{ a: 1, b: "x" }`.
pub fn render_doc(d: &Document) -> String {
    if d.is_empty() {
        return "{}".to_string();
    }
    let fields: Vec<String> = d
        .iter()
        .map(|(k, v)| format!("{k}: {}", render_value(v)))
        .collect();
    format!("{{ {} }}", fields.join(", "))
}

/// Renders one value.
pub fn render_value(v: &Bson) -> String {
    match v {
        Bson::String(s) => format!("{s:?}"),
        Bson::Int32(i) => i.to_string(),
        Bson::Int64(i) => i.to_string(),
        Bson::Double(d) => {
            if d.fract() == 0.0 && d.is_finite() && d.abs() < 1e15 {
                format!("{d:.1}")
            } else {
                d.to_string()
            }
        }
        Bson::Boolean(b) => b.to_string(),
        Bson::Null => "null".to_string(),
        Bson::ObjectId(o) => format!("ObjectId('{o}')"),
        Bson::Document(d) => render_doc(d),
        Bson::Array(items) => {
            let parts: Vec<String> = items.iter().map(render_value).collect();
            format!("[ {} ]", parts.join(", "))
        }
        Bson::DateTime(d) => format!("new Date({})", d.timestamp_millis()),
        Bson::MinKey => "MinKey".to_string(),
        Bson::MaxKey => "MaxKey".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn renders_like_mongod() {
        assert_eq!(render_doc(&doc! {"_id": 1}), "{ _id: 1 }");
        assert_eq!(
            render_doc(&doc! {"_id": "a", "x": 2.0}),
            "{ _id: \"a\", x: 2.0 }"
        );
        assert_eq!(render_doc(&doc! {"a": [1, 2]}), "{ a: [ 1, 2 ] }");
    }
}

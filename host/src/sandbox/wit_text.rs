//! Renders component types in WIT-like text for `wtune inspect` and for
//! contract errors.

use wasmtime::component::types::{ComponentFunc, ComponentItem, Type};

/// `func(config: string) -> result<_, string>`
pub(crate) fn func(f: &ComponentFunc) -> String {
    let params: Vec<String> = f
        .params()
        .map(|(name, ty)| format!("{name}: {}", ty_text(&ty)))
        .collect();
    let results: Vec<String> = f.results().map(|ty| ty_text(&ty)).collect();
    match results.as_slice() {
        [] => format!("func({})", params.join(", ")),
        [one] => format!("func({}) -> {one}", params.join(", ")),
        many => format!("func({}) -> ({})", params.join(", "), many.join(", ")),
    }
}

/// A short description of any component item.
pub(crate) fn item(item: &ComponentItem) -> String {
    match item {
        ComponentItem::ComponentFunc(f) => func(f),
        ComponentItem::CoreFunc(_) => "core func".into(),
        ComponentItem::Module(_) => "core module".into(),
        ComponentItem::Component(_) => "component".into(),
        ComponentItem::ComponentInstance(_) => "instance".into(),
        ComponentItem::Type(ty) => format!("type {}", ty_text(ty)),
        ComponentItem::Resource(_) => "resource".into(),
    }
}

fn ty_text(ty: &Type) -> String {
    match ty {
        Type::Bool => "bool".into(),
        Type::S8 => "s8".into(),
        Type::U8 => "u8".into(),
        Type::S16 => "s16".into(),
        Type::U16 => "u16".into(),
        Type::S32 => "s32".into(),
        Type::U32 => "u32".into(),
        Type::S64 => "s64".into(),
        Type::U64 => "u64".into(),
        Type::Float32 => "f32".into(),
        Type::Float64 => "f64".into(),
        Type::Char => "char".into(),
        Type::String => "string".into(),
        Type::List(list) => format!("list<{}>", ty_text(&list.ty())),
        Type::Record(record) => {
            let fields: Vec<String> = record
                .fields()
                .map(|f| format!("{}: {}", f.name, ty_text(&f.ty)))
                .collect();
            format!("record {{ {} }}", fields.join(", "))
        }
        Type::Tuple(tuple) => {
            let types: Vec<String> = tuple.types().map(|t| ty_text(&t)).collect();
            format!("tuple<{}>", types.join(", "))
        }
        Type::Variant(variant) => {
            let cases: Vec<String> = variant
                .cases()
                .map(|c| match c.ty {
                    Some(t) => format!("{}({})", c.name, ty_text(&t)),
                    None => c.name.to_string(),
                })
                .collect();
            format!("variant {{ {} }}", cases.join(", "))
        }
        Type::Enum(e) => format!("enum {{ {} }}", e.names().collect::<Vec<_>>().join(", ")),
        Type::Option(o) => format!("option<{}>", ty_text(&o.ty())),
        Type::Result(r) => {
            let side = |t: Option<Type>| t.map_or_else(|| "_".to_string(), |t| ty_text(&t));
            format!("result<{}, {}>", side(r.ok()), side(r.err()))
        }
        Type::Flags(flags) => format!(
            "flags {{ {} }}",
            flags.names().collect::<Vec<_>>().join(", ")
        ),
        Type::Own(_) => "own<resource>".into(),
        Type::Borrow(_) => "borrow<resource>".into(),
        other => format!("{other:?}"),
    }
}

//! `protocol/commands.json`: every command as the table in `commands.rs` declares it
//! (name, arity, flags, ACL categories, keys, arguments and options, usage), for the other
//! implementations of the protocol (the Functions library, the clients) and their tests to
//! read instead of copying. A unit test fails when the file is stale; it rewrites it when
//! `RL_WRITE_PROTOCOL=1` is set:
//!
//! ```text
//! RL_WRITE_PROTOCOL=1 cargo test -p redis-rl --lib protocol
//! ```

use crate::arg_doc::ArgDoc;
use crate::boundary::{Keys, Spec};
use redis_module::raw;

fn text(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn kind(a: &ArgDoc) -> &'static str {
    match a.kind {
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY => "key",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER => "integer",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE => "double",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN => "pure-token",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK => "block",
        _ => "string",
    }
}

fn arg(a: &ArgDoc, indent: &str) -> String {
    let mut fields = vec![
        format!("\"name\": {}", text(&a.name.to_string_lossy())),
        format!("\"type\": {}", text(kind(a))),
    ];
    if let Some(t) = a.token {
        fields.push(format!("\"token\": {}", text(&t.to_string_lossy())));
    }
    if a.optional {
        fields.push("\"optional\": true".into());
    }
    if a.multiple {
        fields.push("\"multiple\": true".into());
    }
    if !a.sub.is_empty() {
        fields.push(format!("\"arguments\": {}", args(a.sub, indent)));
    }
    format!("{{{}}}", fields.join(", "))
}

fn args(list: &[ArgDoc], indent: &str) -> String {
    if list.is_empty() {
        return "[]".into();
    }
    let inner = format!("{indent}  ");
    let items: Vec<String> = list
        .iter()
        .map(|a| format!("{inner}{}", arg(a, &inner)))
        .collect();
    format!("[\n{}\n{indent}]", items.join(",\n"))
}

fn keys(k: Keys) -> &'static str {
    match k {
        Keys::OneWritten => "first argument, read and written",
        Keys::OneRead => "first argument, read only",
        Keys::EveryThirdFrom2 => "arguments 2, 5, 8... (the command reports them)",
        Keys::EveryFourthFrom2 => "arguments 2, 6, 10... (the command reports them)",
        Keys::EverySecondFrom2 => "arguments 2, 4, 6...",
        Keys::None => "none",
    }
}

fn command(s: &Spec) -> String {
    let fields = [
        format!("\"name\": {}", text(&s.name.to_string_lossy())),
        format!("\"usage\": {}", text(&s.usage())),
        format!("\"arity\": {}", s.arity),
        format!("\"summary\": {}", text(&s.summary.to_string_lossy())),
        format!("\"complexity\": {}", text(&s.complexity.to_string_lossy())),
        format!("\"flags\": {}", text(&s.flags.to_string_lossy())),
        format!("\"acl_categories\": {}", text(&s.acl.to_string_lossy())),
        format!("\"internal\": {}", s.internal),
        format!("\"keys\": {}", text(keys(s.keys))),
        format!("\"arguments\": {}", args(&s.arg_docs(), "    ")),
    ];
    format!("  {{\n    {}\n  }}", fields.join(",\n    "))
}

/// The file's text for `commands`.
pub fn commands_json(commands: &[Spec]) -> String {
    let items: Vec<String> = commands
        .iter()
        .filter(|s| !s.name.to_bytes().starts_with(b"RL.DEBUG"))
        .map(command)
        .collect();
    format!(
        "{{\n\"about\": \"Written from the command table (src/commands.rs) by a test; do not edit.\",\n\"commands\": [\n{}\n]\n}}\n",
        items.join(",\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn protocol_commands_json_is_up_to_date() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("protocol/commands.json");
        let want = commands_json(crate::commands::COMMANDS);
        if std::env::var_os("RL_WRITE_PROTOCOL").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "protocol/commands.json is stale: RL_WRITE_PROTOCOL=1 cargo test -p redis-rl --lib protocol"
        );
    }
}

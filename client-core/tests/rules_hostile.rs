//! Hostile rules documents: each one is refused with a clear problem (and a line where the
//! text has one), and none costs more than a linear pass over a bounded tree. Aliases are
//! the danger: a YAML text of 1 MiB can name a tree of billions of nodes, and the validator
//! walks the tree it is given (a "billion laughs" document would hang or exhaust the host).

use rl_client_core::rules_doc::Document;

fn refused(text: &str) -> Vec<(Option<u32>, String)> {
    match Document::parse(text) {
        Ok(_) => panic!("accepted: {:.80}", text),
        Err(e) => e
            .problems
            .iter()
            .map(|p| (p.line, p.message.clone()))
            .collect(),
    }
}

/// `layers` lists one aliased layer `m` times, the layer holding `n` unknown fields: a text
/// of O(n + m) bytes naming n * m fields to validate.
fn laughs(n: usize, m: usize) -> String {
    let mut s = String::from("x: &l {name: a, key: k, limit: 1/s");
    for i in 0..n {
        s.push_str(&format!(", f{i}: 0"));
    }
    s.push_str("}\nlayers: [");
    for i in 0..m {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str("*l");
    }
    s.push_str("]\n");
    s
}

#[test]
fn aliases_that_multiply_the_tree_are_refused_at_their_line() {
    let text = laughs(40_000, 100_000);
    assert!(text.len() < 1 << 20, "{}", text.len());
    let problems = refused(&text);
    assert!(
        problems.len() < 100,
        "{} problems: the aliases were expanded",
        problems.len()
    );
    assert!(
        problems
            .iter()
            .any(|(line, m)| *line == Some(2) && m.contains("aliases")),
        "{problems:?}"
    );
}

#[test]
fn nested_aliases_are_refused() {
    // The classic: each level ten aliases of the one before.
    let mut s = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let p = i - 1;
        s.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    s.push_str("layers: [*a9]\n");
    let problems = refused(&s);
    assert!(
        problems.iter().any(|(_, m)| m.contains("aliases")),
        "{problems:?}"
    );
}

#[test]
fn an_alias_of_a_long_string_many_times_is_refused() {
    let big = "k".repeat(200_000);
    let mut s = format!("x: &k '{big}'\nlayers:\n");
    for i in 0..2_000 {
        s.push_str(&format!("  - {{name: l{i}, key: *k, limit: 1/s}}\n"));
    }
    let problems = refused(&s);
    assert!(
        problems.iter().any(|(_, m)| m.contains("aliases")),
        "{problems:?}"
    );
}

#[test]
fn aliases_used_sensibly_still_read() {
    let doc = "x: &l {name: a, key: 'ip:{ip}', limit: 1/s}\nlayers: [*l]\n";
    // `x` is an unknown top-level field; the alias itself is fine.
    let problems = refused(doc);
    assert!(
        problems.iter().all(|(_, m)| !m.contains("aliases")),
        "{problems:?}"
    );
}

#[test]
fn bytes_a_reader_refuses_name_their_line() {
    // A NUL (and any control character) on line 3: libyaml's reader reports an offset,
    // not a mark; the line must still be 3.
    let problems = refused("layers:\n  - {name: a, key: k, limit: 1/s}\n  - \u{0}\n");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].0, Some(3), "{problems:?}");
    assert!(problems[0].1.contains("at line 3"), "{problems:?}");
}

#[test]
fn hostile_shapes_are_problems() {
    let cases: Vec<String> = vec![
        "[".repeat(1 << 19),
        "{a: ".repeat(1 << 17),
        format!("{}a: 1", "- ".repeat(1 << 18)),
        "a:\n".to_string() + &" b:\n".repeat(1 << 15),
        format!("%YAML 1.{}\n---\na: 1\n", "9".repeat(100)),
        format!("!{} a\n", "t".repeat(1 << 19)),
        format!("&{} a\n", "a".repeat(1 << 19)),
        "!!binary AAAA\n".to_string(),
        "a: !<tag:yaml.org,2002:int> x\n".to_string(),
        format!("'{}'\n", "\\u0000".repeat(1 << 16)),
        format!("\"{}\"\n", "\\UFFFFFFFF".repeat(1 << 15)),
        "layers: [{name: a, key: k, limit: 1/s}]\nlayers: []\n".to_string(),
        "a: 1".to_string() + &"\n".repeat(1 << 20),
        "x".repeat((1 << 20) + 1),
    ];
    for text in cases {
        assert!(!refused(&text).is_empty(), "{:.40}", text);
    }
}

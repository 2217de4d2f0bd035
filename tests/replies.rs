//! Reply types: under RESP3 every reply has the documented type (doubles are doubles, PEEK
//! a map, MTAKE's denied_by a string), and errors stay errors.

mod support;

use support::*;

fn cmd(c: &mut Connection, args: &[&str]) -> redis::RedisResult<Value> {
    redis::cmd(args[0]).arg(&args[1..]).query(c)
}

/// RESP3: every reply has the documented type (doubles are doubles, PEEK a map, MTAKE's
/// denied_by a string), and errors stay errors.
#[test]
fn resp3_replies() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let _: Value = redis::cmd("HELLO").arg(3).query(&mut c).unwrap();
    let v: Value = cmd(&mut c, &["RL.TAKE", "k", "1", "10", "2", "WITHSTATE"]).unwrap();
    let Value::Array(items) = v else {
        panic!("{v:?}")
    };
    assert!(matches!(items[0], Value::Int(2)), "{items:?}");
    assert!(
        matches!(items[1], Value::Double(d) if (7.9..=8.1).contains(&d)),
        "{items:?}"
    );
    let v: Value = cmd(&mut c, &["RL.PEEK", "k"]).unwrap();
    let Value::Map(m) = &v else {
        panic!("PEEK under RESP3: {v:?}")
    };
    // Six fields, then `version`, last and an integer.
    assert_eq!(m.len(), 7);
    assert!(matches!(m[1].1, Value::Double(r) if r == 1.0), "{m:?}");
    assert!(
        matches!(&m[6], (Value::SimpleString(k), Value::Int(0)) if k == "version")
            || matches!(&m[6], (Value::BulkString(k), Value::Int(0)) if k == b"version"),
        "{m:?}"
    );
    let v: Value = cmd(
        &mut c,
        &["RL.MTAKE", "9", "k", "1", "10", "j", "1", "10", "WITHSTATE"],
    )
    .unwrap();
    let Value::Array(items) = v else { panic!() };
    assert!(
        matches!(&items[1], Value::BulkString(b) if b == b"k"),
        "{items:?}"
    );
    let Value::Array(rem) = &items[3] else {
        panic!("{items:?}")
    };
    assert!(rem.iter().all(|x| matches!(x, Value::Double(_))), "{rem:?}");
    let v: Value = cmd(&mut c, &["RL.PEEK", "nokey"]).unwrap();
    assert_eq!(v, Value::Nil);
    assert!(cmd(&mut c, &["RL.TAKE", "k", "1", "10", "11"]).is_err());
    let v: Value = cmd(&mut c, &["RL.LEASE", "k", "1", "10", "3", "1000"]).unwrap();
    assert!(matches!(&v, Value::Array(a) if a.len() == 4), "{v:?}");
}

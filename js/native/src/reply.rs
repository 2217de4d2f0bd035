//! A reply as ioredis and node-redis hand it over (a Buffer or string, a number or BigInt,
//! null, an array, a plain object or `Map` for RESP3's map, an `Error` instance for an error
//! reply inside an array) as the client core's neutral [`Reply`]: the one conversion every
//! binding that parses a reply uses. Anything else is a `ProtocolError`, never a panic.

use napi::{
    Env, JsBigInt, JsBuffer, JsFunction, JsNumber, JsObject, JsString, JsUnknown, ValueType,
};

use rl_client_core::{ProtocolError, Reply};

/// Deepest nesting read (a reply of the commands parsed here is at most two deep).
const MAX_DEPTH: usize = 8;
/// Most elements read from one array or map (a reply here has a handful).
const MAX_ITEMS: u32 = 4096;

fn failed(what: &str, e: napi::Error) -> ProtocolError {
    ProtocolError(format!("{what}: {}", e.reason))
}

pub fn to_reply(env: &Env, value: JsUnknown) -> Result<Reply, ProtocolError> {
    convert(env, value, 0)
}

fn items(env: &Env, array: &JsObject, depth: usize) -> Result<Vec<Reply>, ProtocolError> {
    let len = array
        .get_array_length()
        .map_err(|e| failed("an array", e))?;
    if len > MAX_ITEMS {
        return Err(ProtocolError(format!("an array of {len} elements")));
    }
    (0..len)
        .map(|i| {
            let x: JsUnknown = array
                .get_element(i)
                .map_err(|e| failed("an array element", e))?;
            convert(env, x, depth + 1)
        })
        .collect()
}

fn convert(env: &Env, value: JsUnknown, depth: usize) -> Result<Reply, ProtocolError> {
    if depth > MAX_DEPTH {
        return Err(ProtocolError("a reply nested too deep".into()));
    }
    let kind = value.get_type().map_err(|e| failed("a reply", e))?;
    match kind {
        ValueType::Null | ValueType::Undefined => Ok(Reply::Nil),
        ValueType::Number => {
            // SAFETY: the value's type was checked just above.
            let n: JsNumber = unsafe { value.cast() };
            let x = n.get_double().map_err(|e| failed("a number", e))?;
            // An integer reply arrives as a whole number, RESP3's double as any number: a
            // whole one is read as either (the parsers take an integer where a number is
            // expected).
            if x.fract() == 0.0 && x.abs() <= 9_007_199_254_740_991.0 {
                Ok(Reply::Int(x as i64))
            } else {
                Ok(Reply::Double(x))
            }
        }
        ValueType::BigInt => {
            // SAFETY: checked above.
            let b: JsBigInt = unsafe { value.cast() };
            let (x, lossless) = b.get_i64().map_err(|e| failed("a BigInt", e))?;
            if lossless {
                Ok(Reply::Int(x))
            } else {
                Err(ProtocolError("an integer reply beyond 64 bits".into()))
            }
        }
        ValueType::String => {
            // SAFETY: checked above.
            let s: JsString = unsafe { value.cast() };
            let text = s.into_utf8().map_err(|e| failed("a string", e))?;
            Ok(Reply::Bulk(text.as_slice().to_vec()))
        }
        ValueType::Object => {
            // Arrays first: every reply parsed here is one.
            if value.is_array().map_err(|e| failed("a reply", e))? {
                // SAFETY: an object (checked above).
                let obj: JsObject = unsafe { value.cast() };
                return items(env, &obj, depth).map(Reply::Array);
            }
            if value.is_buffer().map_err(|e| failed("a reply", e))? {
                // SAFETY: is_buffer checked it.
                let b: JsBuffer = unsafe { value.cast() };
                let data = b.into_value().map_err(|e| failed("a Buffer", e))?;
                return Ok(Reply::Bulk(data.to_vec()));
            }
            let is_error = value.is_error().map_err(|e| failed("a reply", e))?;
            // SAFETY: an object (checked above).
            let obj: JsObject = unsafe { value.cast() };
            if is_error {
                let message: JsUnknown = obj
                    .get_named_property("message")
                    .map_err(|e| failed("an error", e))?;
                let text = match message.get_type() {
                    Ok(ValueType::String) => {
                        // SAFETY: checked.
                        let s: JsString = unsafe { message.cast() };
                        s.into_utf8()
                            .and_then(|u| u.into_owned())
                            .unwrap_or_default()
                    }
                    _ => String::new(),
                };
                return Ok(Reply::Error(text));
            }
            if is_instance(env, &obj, "Map")? {
                // [[key, value], ...] by Array.from(map): pairs in the map's order.
                let global = env.get_global().map_err(|e| failed("a Map", e))?;
                // Array is a function: read as the object it also is.
                let array: JsObject = global
                    .get_named_property_unchecked("Array")
                    .map_err(|e| failed("a Map", e))?;
                let from: JsFunction = array
                    .get_named_property("from")
                    .map_err(|e| failed("a Map", e))?;
                let pairs = from
                    .call(Some(&array), &[obj])
                    .map_err(|e| failed("a Map", e))?;
                // SAFETY: Array.from returns an array.
                let pairs: JsObject = unsafe { pairs.cast() };
                return items(env, &pairs, depth)?
                    .into_iter()
                    .map(|pair| match pair {
                        Reply::Array(mut kv) if kv.len() == 2 => {
                            let v = kv.pop().unwrap_or(Reply::Nil);
                            let k = kv.pop().unwrap_or(Reply::Nil);
                            Ok((k, v))
                        }
                        _ => Err(ProtocolError("a Map entry that is no pair".into())),
                    })
                    .collect::<Result<_, _>>()
                    .map(Reply::Map);
            }
            if is_plain_object(env, &obj)? {
                // RESP3's map as node-redis hands it over by default: keys in insertion order.
                let names = obj
                    .get_property_names()
                    .map_err(|e| failed("an object", e))?;
                let len = names
                    .get_array_length()
                    .map_err(|e| failed("an object", e))?;
                if len > MAX_ITEMS {
                    return Err(ProtocolError(format!("a map of {len} entries")));
                }
                let mut pairs = Vec::with_capacity(len as usize);
                for i in 0..len {
                    let name: JsString = names
                        .get_element(i)
                        .map_err(|e| failed("an object key", e))?;
                    let key = name
                        .into_utf8()
                        .map_err(|e| failed("an object key", e))?
                        .as_slice()
                        .to_vec();
                    let v: JsUnknown = obj
                        .get_property(name)
                        .map_err(|e| failed("an object value", e))?;
                    pairs.push((Reply::Bulk(key), convert(env, v, depth + 1)?));
                }
                return Ok(Reply::Map(pairs));
            }
            Err(ProtocolError(
                "an object that is no Redis reply (not an array, Buffer, Map, Error or plain object)"
                    .into(),
            ))
        }
        // RESP3's boolean: the commands parsed here never send one.
        ValueType::Boolean => Err(ProtocolError(
            "a boolean reply where none is expected".into(),
        )),
        other => Err(ProtocolError(format!(
            "a value of type {other:?} is no Redis reply"
        ))),
    }
}

fn is_instance(env: &Env, obj: &JsObject, class: &str) -> Result<bool, ProtocolError> {
    let global = env.get_global().map_err(|e| failed(class, e))?;
    let ctor: JsFunction = global
        .get_named_property(class)
        .map_err(|e| failed(class, e))?;
    obj.instanceof(ctor).map_err(|e| failed(class, e))
}

/// An object whose prototype is `Object.prototype` or null (not a class instance, a Date,
/// a Promise...).
fn is_plain_object(env: &Env, obj: &JsObject) -> Result<bool, ProtocolError> {
    let global = env.get_global().map_err(|e| failed("an object", e))?;
    let object: JsObject = global
        .get_named_property_unchecked("Object")
        .map_err(|e| failed("an object", e))?;
    let get_proto: JsFunction = object
        .get_named_property("getPrototypeOf")
        .map_err(|e| failed("an object", e))?;
    let proto = get_proto
        .call(Some(&object), &[obj])
        .map_err(|e| failed("an object", e))?;
    match proto.get_type().map_err(|e| failed("an object", e))? {
        ValueType::Null => Ok(true),
        ValueType::Object => {
            let object_proto: JsUnknown = object
                .get_named_property("prototype")
                .map_err(|e| failed("an object", e))?;
            env.strict_equals(proto, object_proto)
                .map_err(|e| failed("an object", e))
        }
        _ => Ok(false),
    }
}

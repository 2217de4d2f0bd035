//! Typed arrays (the numbers a call reads or writes) read in place. napi-rs's `Float64Array`
//! argument takes a reference on the array for each call (about 100 ns, more than the rest
//! of a take's decision); the array is only used while the call runs, when the caller holds
//! it anyway, so its memory is read through `napi_get_typedarray_info` alone.

use napi::{JsTypedArray, JsTypedArrayValue, TypedArrayType};

use crate::guard::invalid;

/// A typed array's elements, valid while the call that was handed the array runs.
pub struct Elements(JsTypedArrayValue);

fn checked(a: JsTypedArray, kind: TypedArrayType, name: &str) -> napi::Result<Elements> {
    let v = a.into_value()?;
    if v.typedarray_type != kind {
        return Err(invalid(format!("a {name} expected")));
    }
    Ok(Elements(v))
}

/// A `Float64Array`'s numbers.
pub fn f64s(a: JsTypedArray) -> napi::Result<Elements> {
    checked(a, TypedArrayType::Float64, "Float64Array")
}

/// A `Uint32Array`'s numbers.
pub fn u32s(a: JsTypedArray) -> napi::Result<Elements> {
    checked(a, TypedArrayType::Uint32, "Uint32Array")
}

impl Elements {
    pub fn f64s(&mut self) -> &mut [f64] {
        // An empty array may have no buffer behind it: nothing to read.
        if self.0.length == 0 {
            return &mut [];
        }
        // The type was checked when made, so as_mut does not panic.
        self.0.as_mut()
    }

    pub fn u32s(&mut self) -> &mut [u32] {
        if self.0.length == 0 {
            return &mut [];
        }
        self.0.as_mut()
    }
}

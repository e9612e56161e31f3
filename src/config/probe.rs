//! What a config struct reads, asked of its own `Deserialize`: the field
//! lists `#[derive(Deserialize)]` hands to `deserialize_struct` (the lists
//! `deny_unknown_fields` checks a table against), an enum's variants, and
//! the kind of value each field asks for. [`super::keys`] builds the key
//! table from them, so the table lists exactly the keys the loader accepts.
//!
//! The probe is a deserializer that answers every request with an error
//! carrying what was requested; a struct's field is reached by handing its
//! visitor a map of that one key, so a path of keys walks nested tables.

use std::fmt;

use serde::de::value::StrDeserializer;
use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// The kind of value a key takes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Shape {
    Bool,
    Int,
    Float,
    Str,
    /// An array of any length.
    Seq(Box<Shape>),
    /// An array of exactly this many elements.
    Tuple(usize, Box<Shape>),
    /// The key may be left out.
    Option(Box<Shape>),
    /// One of these strings.
    Enum(&'static [&'static str]),
    /// A table with these keys.
    Struct(&'static [&'static str]),
    /// A table of any keys.
    Map,
    /// A value of more than one kind (a hand-written `Deserialize`).
    Any,
}

impl Shape {
    /// The shape with any `Option` around it taken off.
    pub(crate) fn inner(&self) -> &Shape {
        match self {
            Shape::Option(s) => s.inner(),
            s => s,
        }
    }
}

/// What `T` reads at `path` (`&[]`: `T` itself; `&["data", "mean"]`: its
/// `data` table's `mean`), or why the path leads nowhere.
pub(crate) fn shape_of<T: DeserializeOwned>(path: &[&str]) -> Result<Shape, String> {
    match T::deserialize(Probe { path }) {
        Err(Found::Shape(s)) => Ok(s),
        Err(Found::Other(msg)) => Err(msg),
        Ok(_) => Err(format!("`{}` read a value from the probe", path.join("."))),
    }
}

/// The probe's "error": what was asked for, or a real failure.
#[derive(Debug)]
enum Found {
    Shape(Shape),
    Other(String),
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Found::Shape(s) => write!(f, "probed {s:?}"),
            Found::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Found {}

impl de::Error for Found {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Found::Other(msg.to_string())
    }
}

fn found<T>(s: Shape) -> Result<T, Found> {
    Err(Found::Shape(s))
}

/// Wraps the shape an inner probe found (an array's element, an option's value).
fn wrap<T>(r: Result<T, Found>, f: impl FnOnce(Shape) -> Shape) -> Result<T, Found> {
    match r {
        Err(Found::Shape(s)) => found(f(s)),
        other => other,
    }
}

struct Probe<'p> {
    path: &'p [&'p str],
}

impl Probe<'_> {
    /// A value that is not a table cannot hold the path's next key.
    fn no_keys_left(&self) -> Result<(), Found> {
        match self.path.first() {
            None => Ok(()),
            Some(k) => Err(Found::Other(format!("`{k}` is not a key here: the value is not a table"))),
        }
    }

    /// A leaf value.
    fn leaf<T>(self, s: Shape) -> Result<T, Found> {
        self.no_keys_left()?;
        found(s)
    }

    /// A table: its shape, or the path's next key handed to its visitor.
    fn table<'de, V: Visitor<'de>>(self, s: Shape, v: V) -> Result<V::Value, Found> {
        match self.path.split_first() {
            None => found(s),
            Some((key, rest)) => v.visit_map(OneKey { key, rest, done: false }),
        }
    }
}

macro_rules! leaves {
    ($($method:ident => $shape:expr),+ $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, _v: V) -> Result<V::Value, Found> {
            self.leaf($shape)
        })+
    };
}

impl<'de> de::Deserializer<'de> for Probe<'_> {
    type Error = Found;

    leaves! {
        deserialize_any => Shape::Any,
        deserialize_bool => Shape::Bool,
        deserialize_i8 => Shape::Int,
        deserialize_i16 => Shape::Int,
        deserialize_i32 => Shape::Int,
        deserialize_i64 => Shape::Int,
        deserialize_i128 => Shape::Int,
        deserialize_u8 => Shape::Int,
        deserialize_u16 => Shape::Int,
        deserialize_u32 => Shape::Int,
        deserialize_u64 => Shape::Int,
        deserialize_u128 => Shape::Int,
        deserialize_f32 => Shape::Float,
        deserialize_f64 => Shape::Float,
        deserialize_char => Shape::Str,
        deserialize_str => Shape::Str,
        deserialize_string => Shape::Str,
        deserialize_bytes => Shape::Str,
        deserialize_byte_buf => Shape::Str,
        deserialize_unit => Shape::Any,
        deserialize_identifier => Shape::Str,
        deserialize_ignored_any => Shape::Any,
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Found> {
        if self.path.is_empty() {
            wrap(v.visit_some(self), |s| Shape::Option(Box::new(s)))
        } else {
            v.visit_some(self)
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _name: &'static str, v: V) -> Result<V::Value, Found> {
        self.deserialize_unit(v)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, Found> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Found> {
        self.no_keys_left()?;
        wrap(v.visit_seq(Element), |s| Shape::Seq(Box::new(s)))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, v: V) -> Result<V::Value, Found> {
        self.no_keys_left()?;
        wrap(v.visit_seq(Element), |s| Shape::Tuple(len, Box::new(s)))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        v: V,
    ) -> Result<V::Value, Found> {
        self.deserialize_tuple(len, v)
    }

    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Found> {
        self.table(Shape::Map, v)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Found> {
        self.table(Shape::Struct(fields), v)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        _v: V,
    ) -> Result<V::Value, Found> {
        self.leaf(Shape::Enum(variants))
    }
}

/// An array's first element, probed.
struct Element;

impl<'de> SeqAccess<'de> for Element {
    type Error = Found;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Found> {
        seed.deserialize(Probe { path: &[] }).map(Some)
    }
}

/// A table holding one key, whose value is probed along the rest of the path.
struct OneKey<'p> {
    key: &'p str,
    rest: &'p [&'p str],
    done: bool,
}

impl<'de> MapAccess<'de> for OneKey<'_> {
    type Error = Found;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Found> {
        if self.done {
            return Ok(None);
        }
        seed.deserialize(StrDeserializer::<Found>::new(self.key)).map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Found> {
        self.done = true;
        seed.deserialize(Probe { path: self.rest })
    }
}

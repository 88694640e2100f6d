//! Host tensors: what crosses the boundary between rumus and its user (inputs fed to a step,
//! outputs read back, parameters in a checkpoint). Row-major, owned, f32 or i32.

use crate::error::{Error, Result};
use std::fmt;

/// Element type of a graph value or host tensor: f32 for values, i32 for indices and labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 32-bit signed integer.
    I32,
}

impl DType {
    /// `f32` or `i32`, as the model language spells it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::I32 => "i32",
        }
    }

    /// Bytes per element (both dtypes are 4 bytes wide).
    pub fn size(self) -> usize {
        4
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The elements of a host tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// f32 elements.
    F32(Vec<f32>),
    /// i32 elements.
    I32(Vec<i32>),
}

/// An owned, row-major host tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: TensorData,
}

/// The most elements one value (a host tensor, a graph node) may hold: 2^40, 4 TiB of f32.
/// Far beyond any machine's memory, and small enough that byte counts (`× 4`) and sums of the
/// byte counts of a whole graph's values never overflow a `u64`.
pub const MAX_ELEMENTS: usize = 1 << 40;

/// Most dimensions a shape may have (NumPy's limit). Work per element grows with the rank, and
/// some passes are quadratic in it: a model input of rank 35,000 took seconds per step.
pub const MAX_RANK: usize = 32;

/// Number of elements of a shape, or an error when it is over [`MAX_ELEMENTS`] or has more than
/// [`MAX_RANK`] dimensions. The product of the non-zero dimensions is checked too, so that every
/// partial product of a checked shape (a row length, a stride) is also at most [`MAX_ELEMENTS`],
/// whatever the order of the axes.
pub fn checked_numel(shape: &[usize]) -> Result<usize> {
    if shape.len() > MAX_RANK {
        return Err(Error::shape(format!(
            "a shape of {} dimensions is over the limit of {MAX_RANK}",
            shape.len()
        )));
    }
    let nonzero = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d.max(1)));
    match nonzero {
        Some(n) if n <= MAX_ELEMENTS => Ok(shape.iter().product()),
        // An empty shape holds nothing, but its strides would still pass the limit.
        _ if shape.contains(&0) => Err(Error::shape(format!(
            "shape {} is empty, but its other axes span more than 2^40 elements, the most one value may index",
            fmt_shape(shape)
        ))),
        _ => Err(Error::shape(format!(
            "shape {} has more than 2^40 elements, the most one value may hold",
            fmt_shape(shape)
        ))),
    }
}

/// `[2, 3]`-style rendering of a shape, as used in every error message.
pub fn fmt_shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

impl Tensor {
    /// An f32 tensor; errors when `data.len()` is not the product of `shape`.
    pub fn f32(shape: &[usize], data: Vec<f32>) -> Result<Tensor> {
        Tensor::new(shape, TensorData::F32(data))
    }

    /// An i32 tensor; errors when `data.len()` is not the product of `shape`.
    pub fn i32(shape: &[usize], data: Vec<i32>) -> Result<Tensor> {
        Tensor::new(shape, TensorData::I32(data))
    }

    /// A tensor of either dtype; errors when the element count is not the product of `shape`
    /// or the shape is over [`MAX_ELEMENTS`] or [`MAX_RANK`].
    pub fn new(shape: &[usize], data: TensorData) -> Result<Tensor> {
        let n = checked_numel(shape)?;
        let len = match &data {
            TensorData::F32(v) => v.len(),
            TensorData::I32(v) => v.len(),
        };
        if n != len {
            return Err(Error::shape(format!(
                "tensor of shape {} needs {n} elements, got {len}",
                fmt_shape(shape)
            )));
        }
        Ok(Tensor { shape: shape.to_vec(), data })
    }

    /// A scalar (shape `[]`) f32 tensor.
    pub fn scalar(v: f32) -> Tensor {
        Tensor { shape: vec![], data: TensorData::F32(vec![v]) }
    }

    /// A tensor of zeros; errors when the shape is over [`MAX_ELEMENTS`] or [`MAX_RANK`].
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n = checked_numel(shape)?;
        let data = match dtype {
            DType::F32 => TensorData::F32(vec![0.0; n]),
            DType::I32 => TensorData::I32(vec![0; n]),
        };
        Ok(Tensor { shape: shape.to_vec(), data })
    }

    /// The dimensions, outermost first (`[]` for a scalar).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self.data {
            TensorData::F32(_) => DType::F32,
            TensorData::I32(_) => DType::I32,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        match &self.data {
            TensorData::F32(v) => v.len(),
            TensorData::I32(v) => v.len(),
        }
    }

    /// Bytes of the elements (4 per element).
    pub fn bytes(&self) -> u64 {
        self.numel() as u64 * 4
    }

    /// The elements.
    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// The elements, taking the tensor apart.
    pub fn into_data(self) -> TensorData {
        self.data
    }

    /// The elements of an f32 tensor (`None` for i32).
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            TensorData::F32(v) => Some(v),
            TensorData::I32(_) => None,
        }
    }

    /// The elements of an i32 tensor (`None` for f32).
    pub fn as_i32(&self) -> Option<&[i32]> {
        match &self.data {
            TensorData::I32(v) => Some(v),
            TensorData::F32(_) => None,
        }
    }

    /// The elements of an f32 tensor, mutable (`None` for i32).
    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        match &mut self.data {
            TensorData::F32(v) => Some(v),
            TensorData::I32(_) => None,
        }
    }

    /// The elements of an i32 tensor, mutable (`None` for f32).
    pub fn as_i32_mut(&mut self) -> Option<&mut [i32]> {
        match &mut self.data {
            TensorData::I32(v) => Some(v),
            TensorData::F32(_) => None,
        }
    }

    /// Elements as f32 (i32 elements converted), for printing and comparisons.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            TensorData::F32(v) => v.clone(),
            TensorData::I32(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }

    /// Raw little-endian bytes of the elements.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match &self.data {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// Same elements, new shape with the same element count.
    pub fn reshape(mut self, shape: &[usize]) -> Result<Tensor> {
        if checked_numel(shape)? != self.numel() {
            return Err(Error::shape(format!(
                "cannot reshape {} into {}",
                fmt_shape(&self.shape),
                fmt_shape(shape)
            )));
        }
        self.shape = shape.to_vec();
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_length_is_an_error_naming_the_shape() {
        let e = Tensor::f32(&[2, 3], vec![0.0; 5]).unwrap_err();
        assert_eq!(e.to_string(), "tensor of shape [2, 3] needs 6 elements, got 5");
    }

    #[test]
    fn shapes_over_the_element_limit_are_errors() {
        let over = "has more than 2^40 elements, the most one value may hold";
        for shape in [&[usize::MAX, 2][..], &[1 << 32, 1 << 32], &[1 << 41]] {
            let e = checked_numel(shape).unwrap_err();
            assert_eq!(e.to_string(), format!("shape {} {over}", fmt_shape(shape)));
        }
        // Found by the hostile-input hunt: an empty shape was said to have too many elements.
        let e = checked_numel(&[0, 1 << 30, 1 << 30]).unwrap_err();
        let want = "shape [0, 1073741824, 1073741824] is empty, but its other axes span more than 2^40 elements, the most one value may index";
        assert_eq!(e.to_string(), want);
        assert!(Tensor::zeros(&[usize::MAX, 2], DType::F32).is_err());
        assert_eq!(checked_numel(&[1 << 20, 1 << 20]).unwrap(), 1 << 40);
        assert_eq!(checked_numel(&[0, 1 << 40]).unwrap(), 0);
    }
}

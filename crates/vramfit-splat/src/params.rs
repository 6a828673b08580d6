//! The table of a Gaussian's parameter tensors: their names, order and
//! widths, defined here once. Whatever carries the parameters (host
//! arrays, borrowed slices, gradients, Burn tensors, device buffers, Adam
//! moments) is a [`Params`] of its own element type, so adding or
//! reshaping a parameter is one change to this table.

use std::ops::{Index, IndexMut};

/// One of the four parameter tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Param {
    /// `[N, 2]` centres in `[0, 1]²`.
    Xy,
    /// `[N, 2]` inverse pixel-space standard deviations.
    InvScale,
    /// `[N, 1]` rotations in radians.
    Theta,
    /// `[N, C]` colours (unclamped, display range `[0, 1]`).
    Color,
}

impl Param {
    /// Every parameter, in table order (the order of files, checkpoints,
    /// gradients and learning rates).
    pub const ALL: [Param; 4] = [Param::Xy, Param::InvScale, Param::Theta, Param::Color];

    /// Name in files, checkpoints, reports and config keys (`lr_<name>`).
    pub const fn name(self) -> &'static str {
        match self {
            Param::Xy => "xy",
            Param::InvScale => "inv_scale",
            Param::Theta => "theta",
            Param::Color => "color",
        }
    }

    /// Values per Gaussian (the tensor's second dimension) for `channels`
    /// colour channels.
    pub const fn width(self, channels: usize) -> usize {
        match self {
            Param::Xy | Param::InvScale => 2,
            Param::Theta => 1,
            Param::Color => channels,
        }
    }
}

/// Stored values per Gaussian over all parameters.
pub fn values_per_gaussian(channels: usize) -> usize {
    Param::ALL.iter().map(|p| p.width(channels)).sum()
}

/// One `T` per parameter tensor.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Params<T> {
    /// Centres.
    pub xy: T,
    /// Inverse scales.
    pub inv_scale: T,
    /// Rotations.
    pub theta: T,
    /// Colours.
    pub color: T,
}

impl<T> Params<T> {
    /// Builds each entry from its parameter.
    pub fn from_fn(mut f: impl FnMut(Param) -> T) -> Self {
        Self {
            xy: f(Param::Xy),
            inv_scale: f(Param::InvScale),
            theta: f(Param::Theta),
            color: f(Param::Color),
        }
    }

    /// Builds each entry from its parameter, stopping at the first error.
    pub fn try_from_fn<E>(mut f: impl FnMut(Param) -> Result<T, E>) -> Result<Self, E> {
        Ok(Self {
            xy: f(Param::Xy)?,
            inv_scale: f(Param::InvScale)?,
            theta: f(Param::Theta)?,
            color: f(Param::Color)?,
        })
    }

    /// As an array in table order.
    pub fn into_array(self) -> [T; 4] {
        [self.xy, self.inv_scale, self.theta, self.color]
    }

    /// Applies `f` to each entry.
    pub fn map<U>(self, mut f: impl FnMut(T) -> U) -> Params<U> {
        Params {
            xy: f(self.xy),
            inv_scale: f(self.inv_scale),
            theta: f(self.theta),
            color: f(self.color),
        }
    }

    /// Applies `f` to each entry, stopping at the first error.
    pub fn try_map<U, E>(self, mut f: impl FnMut(T) -> Result<U, E>) -> Result<Params<U>, E> {
        Ok(Params {
            xy: f(self.xy)?,
            inv_scale: f(self.inv_scale)?,
            theta: f(self.theta)?,
            color: f(self.color)?,
        })
    }

    /// Applies `f` to each entry with its parameter.
    pub fn map_param<U>(self, mut f: impl FnMut(Param, T) -> U) -> Params<U> {
        Params {
            xy: f(Param::Xy, self.xy),
            inv_scale: f(Param::InvScale, self.inv_scale),
            theta: f(Param::Theta, self.theta),
            color: f(Param::Color, self.color),
        }
    }

    /// Pairs each entry with the same parameter's entry of `other`.
    pub fn zip<U>(self, other: Params<U>) -> Params<(T, U)> {
        Params {
            xy: (self.xy, other.xy),
            inv_scale: (self.inv_scale, other.inv_scale),
            theta: (self.theta, other.theta),
            color: (self.color, other.color),
        }
    }

    /// Borrows each entry.
    pub fn as_ref(&self) -> Params<&T> {
        Params {
            xy: &self.xy,
            inv_scale: &self.inv_scale,
            theta: &self.theta,
            color: &self.color,
        }
    }

    /// Borrows each entry mutably.
    pub fn as_mut(&mut self) -> Params<&mut T> {
        Params {
            xy: &mut self.xy,
            inv_scale: &mut self.inv_scale,
            theta: &mut self.theta,
            color: &mut self.color,
        }
    }

    /// `(parameter, entry)` in table order.
    pub fn iter(&self) -> impl Iterator<Item = (Param, &T)> {
        Param::ALL.into_iter().zip(self.as_ref().into_array())
    }
}

impl<T> Index<Param> for Params<T> {
    type Output = T;
    fn index(&self, p: Param) -> &T {
        match p {
            Param::Xy => &self.xy,
            Param::InvScale => &self.inv_scale,
            Param::Theta => &self.theta,
            Param::Color => &self.color,
        }
    }
}

impl<T> IndexMut<Param> for Params<T> {
    fn index_mut(&mut self, p: Param) -> &mut T {
        match p {
            Param::Xy => &mut self.xy,
            Param::InvScale => &mut self.inv_scale,
            Param::Theta => &mut self.theta,
            Param::Color => &mut self.color,
        }
    }
}

/// Host arrays, flat and row major (`[N, width]` each).
pub type HostParams<F = f32> = Params<Vec<F>>;

impl<F> Params<Vec<F>> {
    /// Gaussians held (theta has one value per Gaussian).
    pub fn count(&self) -> usize {
        self.theta.len()
    }

    /// Borrowed as slices.
    pub fn slices(&self) -> Params<&[F]> {
        Params {
            xy: &self.xy,
            inv_scale: &self.inv_scale,
            theta: &self.theta,
            color: &self.color,
        }
    }

    /// Zero-filled arrays for `n` Gaussians of `channels` colours.
    pub fn zeros(n: usize, channels: usize) -> Self
    where
        F: Clone + Default,
    {
        Self::from_fn(|p| vec![F::default(); n * p.width(channels)])
    }
}

impl<F> Params<&[F]> {
    /// Gaussians held.
    pub fn count(&self) -> usize {
        self.theta.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_order_names_and_widths_agree() {
        let names: Vec<_> = Param::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["xy", "inv_scale", "theta", "color"]);
        assert_eq!(values_per_gaussian(3), 8);
        let t = Params::from_fn(|p| p.width(3));
        assert_eq!(t.into_array(), [2, 2, 1, 3]);
        for (p, w) in t.iter() {
            assert_eq!(t[p], *w);
        }
        let z = HostParams::<f32>::zeros(5, 3);
        assert_eq!(z.count(), 5);
        assert_eq!(z.slices().count(), 5);
        assert_eq!(z.map(|v| v.len()).into_array(), [10, 10, 5, 15]);
    }
}

//! What the concerns read and see besides the core observation, each declared in the concern's
//! own module (`decision::ConcernView`): kept here by type, so the reads and the observation
//! hold every concern's part without naming one. The registry of concerns (`plan::Concerns`,
//! a `read::Concerns`) makes them.

use std::any::{Any, TypeId};
use std::collections::HashMap;

/// A value kept by type: cloned with the reads or the observation that hold it.
trait Value: Any + Send + Sync {
    fn clone_box(&self) -> Box<dyn Value>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Any + Clone + Send + Sync> Value for T {
    fn clone_box(&self) -> Box<dyn Value> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Values by the type of the concern part they belong to (one per concern view type).
#[derive(Default)]
pub struct ByType(HashMap<TypeId, Box<dyn Value>>);

impl ByType {
    /// Keep `value` as the part of concern view `K` (a view is its own key).
    pub fn insert<K: Any, T: Any + Clone + Send + Sync>(&mut self, value: T) {
        self.0.insert(TypeId::of::<K>(), Box::new(value));
    }

    /// The part of concern view `K`, when it is of type `T`.
    pub fn get<K: Any, T: Any>(&self) -> Option<&T> {
        let value: &dyn Value = &**self.0.get(&TypeId::of::<K>())?;
        value.as_any().downcast_ref()
    }

    /// The part of concern view `K`, a default one kept first when there is none.
    pub fn get_mut<K: Any, T: Any + Clone + Default + Send + Sync>(&mut self) -> Option<&mut T> {
        let value: &mut dyn Value = &mut **self
            .0
            .entry(TypeId::of::<K>())
            .or_insert_with(|| Box::new(T::default()));
        value.as_any_mut().downcast_mut()
    }
}

impl Clone for ByType {
    fn clone(&self) -> Self {
        ByType(self.0.iter().map(|(k, v)| (*k, (**v).clone_box())).collect())
    }
}

impl std::fmt::Debug for ByType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ByType({} parts)", self.0.len())
    }
}

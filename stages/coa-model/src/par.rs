//! Sharing one output buffer between parallel tasks.

/// An output pointer that parallel tasks share, each writing only its own rows or columns (the
/// one wrapper the crate's rayon loops use).
pub(crate) struct SendPtr<T = f32>(pub(crate) *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: the tasks that share it write disjoint parts (each use says which), and the buffer
// outlives them (rayon joins every task before the owner's borrow ends).
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as for Send: shared by reference, it is still only written in disjoint parts.
unsafe impl<T> Sync for SendPtr<T> {}

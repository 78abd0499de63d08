//! The last cost and gradient an L-BFGS objective computed, kept because
//! argmin asks for the cost and then the gradient at the same point, and
//! the two come out of one computation.

use std::cell::RefCell;

/// One evaluation: where, the cost, and its gradient.
type Evaluation = (Vec<f64>, f64, Vec<f64>);

/// The last evaluation of an objective; see the module's comment.
#[derive(Default)]
pub(super) struct LastEvaluation(RefCell<Option<Evaluation>>);

impl LastEvaluation {
    /// The cost and gradient at `at`: the kept ones when the last
    /// evaluation was there, else `compute`'s, which are kept.
    pub(super) fn at(
        &self,
        at: &[f64],
        compute: impl FnOnce() -> (f64, Vec<f64>),
    ) -> (f64, Vec<f64>) {
        if let Some((point, cost, grad)) = &*self.0.borrow()
            && point == at
        {
            return (*cost, grad.clone());
        }
        let (cost, grad) = compute();
        *self.0.borrow_mut() = Some((at.to_vec(), cost, grad.clone()));
        (cost, grad)
    }
}

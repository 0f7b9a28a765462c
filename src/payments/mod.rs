//! Money, keys, the payment gateway and the receipts it keeps.

pub mod effect;
pub mod gateway;
pub mod keys;
pub mod limits;
pub mod money;
pub mod store;
pub mod stripe;

pub use effect::Effect;
pub use gateway::{ChargeError, Charged, PaymentGateway};
pub use keys::{Charge, ChargeKey, OperationKey, Order, OrderId, PaymentMethod};
pub use limits::PerCurrency;
pub use money::{Currency, Money};
pub use store::{ChargeOutcome, Intents, Receipt, Receipts};

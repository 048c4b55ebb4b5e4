//! Protocol errors as RabbitMQ answers them: a soft error closes the channel, a hard error the
//! connection. The reply text starts with the code's name, as RabbitMQ's does.

use warren_protocol::reply;

#[derive(Debug, Clone)]
pub struct AmqpError {
    pub code: u16,
    pub text: String,
    pub class_id: u16,
    pub method_id: u16,
}

impl AmqpError {
    pub fn new(code: u16, text: impl std::fmt::Display) -> Self {
        AmqpError {
            code,
            text: format!("{} - {}", reply::name(code), text),
            class_id: 0,
            method_id: 0,
        }
    }
    pub fn is_hard(&self) -> bool {
        reply::is_hard(self.code)
    }
    /// Names the method that caused it, as RabbitMQ fills class-id/method-id.
    pub fn on(mut self, class_id: u16, method_id: u16) -> Self {
        if self.class_id == 0 {
            self.class_id = class_id;
            self.method_id = method_id;
        }
        self
    }
}

macro_rules! ctor {
    ($($name:ident => $code:ident),* $(,)?) => {
        impl AmqpError {
            $( pub fn $name(text: impl std::fmt::Display) -> Self { AmqpError::new(reply::$code, text) } )*
        }
    };
}

ctor! {
    access_refused => ACCESS_REFUSED,
    not_found => NOT_FOUND,
    resource_locked => RESOURCE_LOCKED,
    precondition_failed => PRECONDITION_FAILED,
    frame_error => FRAME_ERROR,
    syntax_error => SYNTAX_ERROR,
    command_invalid => COMMAND_INVALID,
    channel_error => CHANNEL_ERROR,
    unexpected_frame => UNEXPECTED_FRAME,
    resource_error => RESOURCE_ERROR,
    not_allowed => NOT_ALLOWED,
    not_implemented => NOT_IMPLEMENTED,
    internal_error => INTERNAL_ERROR,
}

pub type AmqpResult<T> = Result<T, AmqpError>;

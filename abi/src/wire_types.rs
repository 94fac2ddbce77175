//! The shapes of the ABI's wire enums and flag sets, written once: every
//! enum and flag type that crosses the boundary as an integer is declared
//! through these macros, so its wire values, `ALL`, `COUNT` and the
//! refusal of unknown values are the same everywhere.

/// A fieldless enum crossing the boundary as an integer: the enum with its
/// `repr` and wire values, `ALL` its values in declaration order (which
/// is wire order), `COUNT` how many, and `from_wire`, which refuses any
/// value the enum does not define (a damaged or newer message).
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident: $repr:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $value:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[repr($repr)]
        $vis enum $name {
            $($(#[$variant_meta])* $variant = $value,)+
        }

        impl $name {
            /// Every value, in wire order.
            pub const ALL: [Self; Self::COUNT] = [$(Self::$variant),+];
            /// How many values there are.
            pub const COUNT: usize = [$($value),+].len();

            /// The value with this wire value, if it is one.
            #[must_use]
            pub const fn from_wire(value: $repr) -> Option<Self> {
                match value {
                    $($value => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }
    };
}
pub(crate) use wire_enum;

/// A set of flag bits crossing the boundary as an integer: `NONE`, the
/// named flags, and `from_bits`, which refuses bits no flag defines.
macro_rules! wire_flags {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident($repr:ty) {
            $($(#[$flag_meta:meta])* const $flag:ident = $bit:literal;)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        $vis struct $name($repr);

        impl $name {
            /// No flag.
            pub const NONE: Self = Self(0);
            $($(#[$flag_meta])* pub const $flag: Self = Self($bit);)+
            /// Every defined bit.
            const KNOWN: $repr = 0 $(| $bit)+;

            /// The flags with these bits, or `None` when one is undefined.
            #[must_use]
            pub const fn from_bits(bits: $repr) -> Option<Self> {
                if bits & !Self::KNOWN == 0 {
                    Some(Self(bits))
                } else {
                    None
                }
            }

            /// The wire bits.
            #[must_use]
            pub const fn bits(self) -> $repr {
                self.0
            }

            /// Whether every bit of `other` is set.
            #[must_use]
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// These flags and `other`'s.
            #[must_use]
            pub const fn union(self, other: Self) -> Self {
                Self(self.0 | other.0)
            }

            /// These flags without `other`'s.
            #[must_use]
            pub const fn without(self, other: Self) -> Self {
                Self(self.0 & !other.0)
            }
        }
    };
}
pub(crate) use wire_flags;

import CShims

/// An integer that `AtomicMemory` can operate on in place: 32- or 64-bit,
/// signed or unsigned (`Int` and `UInt` are 64-bit on the platforms Spindle
/// supports). Conformances are closed: Spindle provides all six.
public protocol AtomicMemoryWord: FixedWidthInteger, Sendable {}

extension Int32: AtomicMemoryWord {}
extension UInt32: AtomicMemoryWord {}
extension Int64: AtomicMemoryWord {}
extension UInt64: AtomicMemoryWord {}
extension Int: AtomicMemoryWord {}
extension UInt: AtomicMemoryWord {}

/// The OSAtomic family of the *Threading Programming Guide* (Table 4-3) on raw
/// memory: add, increment, decrement, or, and, xor, compare-and-swap,
/// test-and-set and test-and-clear, plus load, store and exchange.
///
/// Replaces Darwin's `OSAtomic` functions (`OSAtomicAdd32Barrier`,
/// `OSAtomicCompareAndSwapPtr`...).
///
/// Unlike `Synchronization.Atomic`, these work on memory Spindle did not
/// allocate: a field of a C struct, a buffer from `mmap`, a page shared with
/// another process. The memory must stay valid and must only be accessed
/// atomically (through these calls or a C peer's `__atomic` builtins) while
/// threads race on it.
///
/// Every operation has the guide's two forms through its `ordering` argument:
/// the plain form (`.relaxed`, the default: atomic, but orders nothing else)
/// and the barrier form (`.barrier`, i.e. `.sequentiallyConsistent`: a full
/// barrier around the operation). In multithreaded code that publishes other
/// data through the word, use the barrier form or the acquire/release pair.
///
/// None of these calls blocks. They compile to single instructions (a locked
/// instruction on x86_64, LSE or an exclusive-pair loop on AArch64) through
/// the C compiler's `__atomic` builtins, which ThreadSanitizer understands.
///
/// Misuse: an address that is not aligned to the word's size stops the
/// process with a message naming the argument (a misaligned atomic is not
/// atomic on every CPU, and on some it faults).
public enum AtomicMemory {
    /// How an atomic operation orders the memory accesses around it.
    public enum Ordering: Sendable, Hashable {
        /// Atomic, but orders nothing else: the guide's plain form.
        case relaxed
        /// Later loads and stores stay after the operation. Pairs with a
        /// `.releasing` write of the same word by another thread: everything
        /// that thread wrote before its release is visible here.
        case acquiring
        /// Earlier loads and stores stay before the operation. Pairs with an
        /// `.acquiring` read of the same word.
        case releasing
        /// Both: for read-modify-write operations that take and hand over.
        case acquiringAndReleasing
        /// Acquiring and releasing, and one total order of all such
        /// operations that every thread agrees on: the guide's barrier form.
        case sequentiallyConsistent

        /// The guide's "Barrier" form of each operation.
        public static var barrier: Ordering { .sequentiallyConsistent }

        /// The C11 order for a read-modify-write.
        @inlinable
        internal var rmw: Int32 {
            switch self {
            case .relaxed: Int32(CSHIMS_ORDER_RELAXED.rawValue)
            case .acquiring: Int32(CSHIMS_ORDER_ACQUIRE.rawValue)
            case .releasing: Int32(CSHIMS_ORDER_RELEASE.rawValue)
            case .acquiringAndReleasing: Int32(CSHIMS_ORDER_ACQ_REL.rawValue)
            case .sequentiallyConsistent: Int32(CSHIMS_ORDER_SEQ_CST.rawValue)
            }
        }

        /// The C11 order for a load: a load cannot release, so the release
        /// half of an ordering is dropped.
        @inlinable
        internal var load: Int32 {
            switch self {
            case .relaxed, .releasing: Int32(CSHIMS_ORDER_RELAXED.rawValue)
            case .acquiring, .acquiringAndReleasing: Int32(CSHIMS_ORDER_ACQUIRE.rawValue)
            case .sequentiallyConsistent: Int32(CSHIMS_ORDER_SEQ_CST.rawValue)
            }
        }

        /// The C11 order for a store: a store cannot acquire, so the acquire
        /// half of an ordering is dropped.
        @inlinable
        internal var store: Int32 {
            switch self {
            case .relaxed, .acquiring: Int32(CSHIMS_ORDER_RELAXED.rawValue)
            case .releasing, .acquiringAndReleasing: Int32(CSHIMS_ORDER_RELEASE.rawValue)
            case .sequentiallyConsistent: Int32(CSHIMS_ORDER_SEQ_CST.rawValue)
            }
        }
    }
}

// MARK: - Word access (load, store, exchange)

extension AtomicMemory {
    /// Reads the word at `address` atomically. A `.releasing` ordering reads
    /// as `.relaxed` and `.acquiringAndReleasing` as `.acquiring`.
    @inlinable
    @inline(__always)
    public static func load<T: AtomicMemoryWord>(
        from address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> T {
        let p = checked(address, "load(from:)")
        if MemoryLayout<T>.size == 4 {
            return T(truncatingIfNeeded: cshims_atomic_load_u32(p.assumingMemoryBound(to: UInt32.self), ordering.load))
        }
        return T(truncatingIfNeeded: cshims_atomic_load_u64(p.assumingMemoryBound(to: UInt64.self), ordering.load))
    }

    /// Writes `value` to the word at `address` atomically. An `.acquiring`
    /// ordering writes as `.relaxed` and `.acquiringAndReleasing` as
    /// `.releasing`.
    @inlinable
    @inline(__always)
    public static func store<T: AtomicMemoryWord>(
        _ value: T, to address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) {
        let p = checked(address, "store(_:to:)")
        if MemoryLayout<T>.size == 4 {
            cshims_atomic_store_u32(p.assumingMemoryBound(to: UInt32.self), UInt32(truncatingIfNeeded: value), ordering.store)
        } else {
            cshims_atomic_store_u64(p.assumingMemoryBound(to: UInt64.self), UInt64(truncatingIfNeeded: value), ordering.store)
        }
    }

    /// Stores `value` and returns the value it replaced, in one atomic step.
    @inlinable
    @inline(__always)
    public static func exchange<T: AtomicMemoryWord>(
        _ value: T, at address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> T {
        let p = checked(address, "exchange(_:at:)")
        if MemoryLayout<T>.size == 4 {
            return T(truncatingIfNeeded: cshims_atomic_exchange_u32(
                p.assumingMemoryBound(to: UInt32.self), UInt32(truncatingIfNeeded: value), ordering.rmw))
        }
        return T(truncatingIfNeeded: cshims_atomic_exchange_u64(
            p.assumingMemoryBound(to: UInt64.self), UInt64(truncatingIfNeeded: value), ordering.rmw))
    }
}

// MARK: - Arithmetic and logic (Table 4-3), returning the new value

extension AtomicMemory {
    /// Adds `amount` to the word at `address` (wrapping on overflow) and
    /// returns the new value: `OSAtomicAdd32`/`OSAtomicAdd64` and their
    /// Barrier forms.
    @inlinable
    @inline(__always)
    @discardableResult
    public static func add<T: AtomicMemoryWord>(
        _ amount: T, to address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> T {
        fetchAdd(checked(address, "add(_:to:)"), amount, ordering) &+ amount
    }

    /// Adds 1 and returns the new value (`OSAtomicIncrement32/64`).
    @inlinable
    @discardableResult
    public static func increment<T: AtomicMemoryWord>(
        _ address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> T {
        fetchAdd(checked(address, "increment(_:)"), T(1), ordering) &+ 1
    }

    /// Subtracts 1 and returns the new value (`OSAtomicDecrement32/64`).
    @inlinable
    @discardableResult
    public static func decrement<T: AtomicMemoryWord>(
        _ address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> T {
        // Adding the all-ones pattern subtracts one for signed and unsigned words alike.
        fetchAdd(checked(address, "decrement(_:)"), T(truncatingIfNeeded: -1 as Int64), ordering) &- 1
    }

    /// ORs `mask` into the word and returns the new value (`OSAtomicOr32`).
    @inlinable
    @discardableResult
    public static func or<T: AtomicMemoryWord>(
        _ mask: T, into address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> T {
        fetchOr(checked(address, "or(_:into:)"), mask, ordering) | mask
    }

    /// ANDs `mask` into the word and returns the new value (`OSAtomicAnd32`).
    @inlinable
    @discardableResult
    public static func and<T: AtomicMemoryWord>(
        _ mask: T, into address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> T {
        fetchAnd(checked(address, "and(_:into:)"), mask, ordering) & mask
    }

    /// XORs `mask` into the word and returns the new value (`OSAtomicXor32`).
    @inlinable
    @discardableResult
    public static func xor<T: AtomicMemoryWord>(
        _ mask: T, into address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> T {
        fetchXor(checked(address, "xor(_:into:)"), mask, ordering) ^ mask
    }

    /// ORs `mask` into the word and returns the value it had before
    /// (`OSAtomicOr32Orig`).
    @inlinable
    @discardableResult
    public static func orOriginal<T: AtomicMemoryWord>(
        _ mask: T, into address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> T {
        fetchOr(checked(address, "orOriginal(_:into:)"), mask, ordering)
    }

    /// ANDs `mask` into the word and returns the value it had before
    /// (`OSAtomicAnd32Orig`).
    @inlinable
    @discardableResult
    public static func andOriginal<T: AtomicMemoryWord>(
        _ mask: T, into address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> T {
        fetchAnd(checked(address, "andOriginal(_:into:)"), mask, ordering)
    }

    /// XORs `mask` into the word and returns the value it had before
    /// (`OSAtomicXor32Orig`).
    @inlinable
    @discardableResult
    public static func xorOriginal<T: AtomicMemoryWord>(
        _ mask: T, into address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> T {
        fetchXor(checked(address, "xorOriginal(_:into:)"), mask, ordering)
    }
}

// MARK: - Compare and swap

extension AtomicMemory {
    /// If the word at `address` equals `expected`, stores `desired`; in one
    /// atomic step. Returns whether it stored (`OSAtomicCompareAndSwap32`,
    /// `64`, `Int`, `Long` and their Barrier forms). Never fails spuriously.
    /// On failure the ordering's release half does not apply (nothing was
    /// written).
    @inlinable
    @inline(__always)
    public static func compareAndSwap<T: AtomicMemoryWord>(
        expected: T, desired: T, at address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> Bool {
        compareExchange(expected: expected, desired: desired, at: address, ordering: ordering).exchanged
    }

    /// As `compareAndSwap`, and also returns the value found at `address`
    /// (equal to `expected` exactly when the exchange happened), which saves
    /// a retry loop its reload.
    @inlinable
    @inline(__always)
    public static func compareExchange<T: AtomicMemoryWord>(
        expected: T, desired: T, at address: UnsafeMutablePointer<T>, ordering: Ordering = .relaxed
    ) -> (exchanged: Bool, original: T) {
        let p = checked(address, "compareAndSwap(expected:desired:at:)")
        if MemoryLayout<T>.size == 4 {
            var found = UInt32(truncatingIfNeeded: expected)
            let ok = cshims_atomic_cas_u32(
                p.assumingMemoryBound(to: UInt32.self), &found, UInt32(truncatingIfNeeded: desired), ordering.rmw)
            return (ok, T(truncatingIfNeeded: found))
        }
        var found = UInt64(truncatingIfNeeded: expected)
        let ok = cshims_atomic_cas_u64(
            p.assumingMemoryBound(to: UInt64.self), &found, UInt64(truncatingIfNeeded: desired), ordering.rmw)
        return (ok, T(truncatingIfNeeded: found))
    }

    /// Compare-and-swap of a pointer-sized slot holding a pointer
    /// (`OSAtomicCompareAndSwapPtr`): stores `desired` if the slot holds
    /// `expected`, and returns whether it did.
    @inlinable
    public static func compareAndSwap(
        expected: UnsafeMutableRawPointer?, desired: UnsafeMutableRawPointer?,
        at address: UnsafeMutablePointer<UnsafeMutableRawPointer?>, ordering: Ordering = .relaxed
    ) -> Bool {
        let p = UnsafeMutableRawPointer(address)
        require(
            Int(bitPattern: p) & (MemoryLayout<UInt>.alignment - 1) == 0,
            "AtomicMemory.compareAndSwap(expected:desired:at:): `address` \(p) is not \(MemoryLayout<UInt>.alignment)-byte aligned")
        var found = UInt(bitPattern: expected)
        return cshims_atomic_cas_uptr(
            p.assumingMemoryBound(to: UInt.self), &found, UInt(bitPattern: desired), ordering.rmw)
    }
}

// MARK: - Raw-pointer forms
//
// These take the word's type explicitly (`as: Int64.self`). Inferring it
// from the value would be a trap: a typed pointer converts to a raw one
// implicitly, and an integer literal defaults to `Int`, so a 32-bit word
// could silently be operated on as 64 bits.

extension AtomicMemory {
    /// `add` on a word of type `T` at a raw address (memory Spindle did not
    /// allocate: a C struct field, a shared mapping). Returns the new value.
    @inlinable
    @inline(__always)
    @discardableResult
    public static func add<T: AtomicMemoryWord>(
        _ amount: T, to address: UnsafeMutableRawPointer, as type: T.Type, ordering: Ordering = .relaxed
    ) -> T {
        add(amount, to: address.assumingMemoryBound(to: T.self), ordering: ordering)
    }

    /// `compareAndSwap` on a word of type `T` at a raw address.
    @inlinable
    @inline(__always)
    public static func compareAndSwap<T: AtomicMemoryWord>(
        expected: T, desired: T, at address: UnsafeMutableRawPointer, as type: T.Type,
        ordering: Ordering = .relaxed
    ) -> Bool {
        compareAndSwap(expected: expected, desired: desired, at: address.assumingMemoryBound(to: T.self), ordering: ordering)
    }

    /// `load` of a word of type `T` at a raw address.
    @inlinable
    @inline(__always)
    public static func load<T: AtomicMemoryWord>(
        _ type: T.Type, from address: UnsafeMutableRawPointer, ordering: Ordering = .relaxed
    ) -> T {
        load(from: address.assumingMemoryBound(to: T.self), ordering: ordering)
    }

    /// `store` of a word of type `T` at a raw address.
    @inlinable
    @inline(__always)
    public static func store<T: AtomicMemoryWord>(
        _ value: T, to address: UnsafeMutableRawPointer, as type: T.Type, ordering: Ordering = .relaxed
    ) {
        store(value, to: address.assumingMemoryBound(to: T.self), ordering: ordering)
    }
}

// MARK: - The primitives the public forms share

extension AtomicMemory {
    /// Returns `address` as raw memory after checking its alignment; `api`
    /// names the public call in the failure message.
    @inlinable
    @inline(__always)
    internal static func checked<T: AtomicMemoryWord>(
        _ address: UnsafeMutablePointer<T>, _ api: @autoclosure () -> String
    ) -> UnsafeMutableRawPointer {
        let raw = UnsafeMutableRawPointer(address)
        require(
            Int(bitPattern: raw) & (MemoryLayout<T>.alignment - 1) == 0,
            "AtomicMemory.\(api()): `address` \(raw) is not \(MemoryLayout<T>.alignment)-byte aligned")
        return raw
    }

    // Width dispatch: `MemoryLayout<T>.size` is a constant once the generic
    // call is specialized, so only one branch survives.

    @inlinable
    @inline(__always)
    internal static func fetchAdd<T: AtomicMemoryWord>(_ p: UnsafeMutableRawPointer, _ v: T, _ o: Ordering) -> T {
        if MemoryLayout<T>.size == 4 {
            return T(truncatingIfNeeded: cshims_atomic_fetch_add_u32(
                p.assumingMemoryBound(to: UInt32.self), UInt32(truncatingIfNeeded: v), o.rmw))
        }
        return T(truncatingIfNeeded: cshims_atomic_fetch_add_u64(
            p.assumingMemoryBound(to: UInt64.self), UInt64(truncatingIfNeeded: v), o.rmw))
    }

    @inlinable
    @inline(__always)
    internal static func fetchOr<T: AtomicMemoryWord>(_ p: UnsafeMutableRawPointer, _ v: T, _ o: Ordering) -> T {
        if MemoryLayout<T>.size == 4 {
            return T(truncatingIfNeeded: cshims_atomic_fetch_or_u32(
                p.assumingMemoryBound(to: UInt32.self), UInt32(truncatingIfNeeded: v), o.rmw))
        }
        return T(truncatingIfNeeded: cshims_atomic_fetch_or_u64(
            p.assumingMemoryBound(to: UInt64.self), UInt64(truncatingIfNeeded: v), o.rmw))
    }

    @inlinable
    @inline(__always)
    internal static func fetchAnd<T: AtomicMemoryWord>(_ p: UnsafeMutableRawPointer, _ v: T, _ o: Ordering) -> T {
        if MemoryLayout<T>.size == 4 {
            return T(truncatingIfNeeded: cshims_atomic_fetch_and_u32(
                p.assumingMemoryBound(to: UInt32.self), UInt32(truncatingIfNeeded: v), o.rmw))
        }
        return T(truncatingIfNeeded: cshims_atomic_fetch_and_u64(
            p.assumingMemoryBound(to: UInt64.self), UInt64(truncatingIfNeeded: v), o.rmw))
    }

    @inlinable
    @inline(__always)
    internal static func fetchXor<T: AtomicMemoryWord>(_ p: UnsafeMutableRawPointer, _ v: T, _ o: Ordering) -> T {
        if MemoryLayout<T>.size == 4 {
            return T(truncatingIfNeeded: cshims_atomic_fetch_xor_u32(
                p.assumingMemoryBound(to: UInt32.self), UInt32(truncatingIfNeeded: v), o.rmw))
        }
        return T(truncatingIfNeeded: cshims_atomic_fetch_xor_u64(
            p.assumingMemoryBound(to: UInt64.self), UInt64(truncatingIfNeeded: v), o.rmw))
    }
}

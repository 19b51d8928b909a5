/// A typed value that each thread has its own copy of, with a destructor that
/// runs on the thread when it exits. Replaces pthread's `pthread_key_create`.
///
/// ```swift
/// static let scratch = ThreadLocal<UnsafeMutableRawBufferPointer>(onThreadExit: { $0.deallocate() })
/// let buffer = Self.scratch.value(orInsert: { .allocate(byteCount: 4096, alignment: 64) })
/// ```
///
/// Every thread starts with no value (`value` is nil). A value is visible
/// only to the thread that stored it, so no access is ever shared and none
/// blocks or orders memory. Works on any thread: Spindle's own, the main
/// thread, Dispatch workers.
///
/// **Destructors.** When a thread exits, each of its values that is still
/// set is passed to its `ThreadLocal`'s destructor, on that thread, exactly
/// once; locals created later are destroyed first. A destructor may store
/// new values; they are destroyed in a further round (at most four rounds,
/// as POSIX does). Replacing or removing a value does not call the
/// destructor: the old value is simply released. A `SpawnedThread`'s values
/// are destroyed before `join()` returns. The main thread's are not: the
/// process ends around it.
///
/// **Lifetime.** Meant to be long-lived (a `static let` or global). Each
/// `ThreadLocal` takes a slot number that is never reused, and every thread
/// that stores a value keeps an array entry for it. If a `ThreadLocal` is
/// released while threads hold values, those values stay until their
/// threads exit, and their destructor still runs then.
///
/// Built on Spindle's per-thread record (`NativeThread.current`), not on
/// `pthread_key_create`, so there is no limit of 1024 keys and no failure
/// to report; an access costs a `pthread_getspecific` and an array index.
public final class ThreadLocal<Value>: @unchecked Sendable {
    // @unchecked: `slot` and `destructor` are immutable; values live in each
    // thread's own NativeThread and are touched only by that thread.

    private let slot: Int
    private let destructor: (@Sendable (Value) -> Void)?

    /// A thread-local with no value on any thread yet. `onThreadExit`, if
    /// given, receives each thread's value as that thread exits.
    public init(onThreadExit destructor: (@Sendable (Value) -> Void)? = nil) {
        self.slot = Int(AtomicMemory.increment(threadLocalSlots.word, ordering: .relaxed)) - 1
        self.destructor = destructor
    }

    /// The calling thread's value, or nil if it has none. Setting nil removes
    /// the value without calling the destructor. Does not block.
    public var value: Value? {
        get { box(in: NativeThread.current)?.value }
        set {
            let thread = NativeThread.current
            if let box = box(in: thread) {
                box.value = newValue
            } else if let newValue {
                install(LocalBox(newValue, destructor), in: thread)
            }
        }
    }

    /// The calling thread's value; if it has none, stores and returns
    /// `make()`. Does not block.
    public func value(orInsert make: () throws -> Value) rethrows -> Value {
        let thread = NativeThread.current
        if let box = box(in: thread), let value = box.value { return value }
        let value = try make()
        if let box = box(in: thread) {
            box.value = value
        } else {
            install(LocalBox(value, destructor), in: thread)
        }
        return value
    }

    /// Runs `body` with the calling thread's value in place (nil if none),
    /// so that a copy-on-write value (an array, a dictionary) is changed
    /// without being copied. Setting it to nil removes it without calling the
    /// destructor. Does not block.
    public func withValue<Result>(_ body: (inout Value?) throws -> Result) rethrows -> Result {
        let thread = NativeThread.current
        let box: LocalBox<Value>
        if let existing = self.box(in: thread) {
            box = existing
        } else {
            box = LocalBox(nil, destructor)
            install(box, in: thread)
        }
        // Moved out so the value is uniquely referenced while `body` runs.
        var value = box.value.take()
        defer { box.value = value }
        return try body(&value)
    }

    /// Removes the calling thread's value and returns it, without calling the
    /// destructor. Does not block.
    @discardableResult
    public func removeValue() -> Value? {
        box(in: NativeThread.current)?.value.take()
    }

    private func box(in thread: NativeThread) -> LocalBox<Value>? {
        guard slot < thread.locals.count, let box = thread.locals[slot] else { return nil }
        return unsafeDowncast(box, to: LocalBox<Value>.self)
    }

    private func install(_ box: LocalBox<Value>, in thread: NativeThread) {
        if thread.locals.count <= slot {
            thread.locals.append(contentsOf: repeatElement(nil, count: slot + 1 - thread.locals.count))
        }
        thread.locals[slot] = box
    }
}

/// The next free `ThreadLocal` slot; slots are never reused.
private let threadLocalSlots = SlotCounter()

private final class SlotCounter: @unchecked Sendable {
    // @unchecked: the word is only accessed through AtomicMemory.
    let word: UnsafeMutablePointer<Int>
    init() {
        word = .allocate(capacity: 1)
        word.initialize(to: 0)
    }
}

/// One thread's value of one `ThreadLocal`, type-erased so that a thread can
/// keep values of every type in one array.
class ThreadLocalBox {
    /// Passes the value, if any, to its destructor. Called once, on the
    /// owning thread, as it exits.
    func destroy() {}
}

final class LocalBox<Value>: ThreadLocalBox {
    var value: Value?
    let destructor: (@Sendable (Value) -> Void)?

    init(_ value: Value?, _ destructor: (@Sendable (Value) -> Void)?) {
        self.value = value
        self.destructor = destructor
    }

    override func destroy() {
        guard let value = value.take() else { return }
        destructor?(value)
    }
}

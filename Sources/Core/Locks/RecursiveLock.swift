import CShims

#if canImport(Glibc)
import Glibc
#endif

/// A lock the holding thread may take again: Spindle's `NSRecursiveLock`
/// and `PTHREAD_MUTEX_RECURSIVE` mutex.
///
/// Each `lock()` by the holder must be balanced by an `unlock()`; the lock is
/// released to other threads when the count returns to zero. Underneath is
/// the same futex mutex as `Lock` (spin briefly, then sleep; eventually fair),
/// plus the owning thread's identity and a depth count.
///
/// Memory: the first acquisition acquires, the last unlock releases (see
/// `Locking`); nested ones order nothing more. Misuse: `unlock()` from a
/// thread that does not hold the lock stops the process with a message
/// naming the problem. `RecursiveLock` is a handle: copies share one lock.
public struct RecursiveLock: Locking, @unchecked Sendable {
    // @unchecked: `owner` is accessed atomically; `depth` only by the thread
    // holding the mutex.

    @usableFromInline
    struct Header {
        /// `pthread_self()` of the holder, or 0. Atomic: other threads read it.
        @usableFromInline var owner: UInt
        /// How many times the holder has locked. Only the holder touches it.
        @usableFromInline var depth: Int
    }

    /// Tail elements: the mutex's words (`FutexMutex.Words`).
    @usableFromInline
    final class Storage: ManagedBuffer<Header, UInt32> {
        deinit {
            withUnsafeMutablePointerToElements {
                LockHooks.destroyed($0)
                LockNames.forget($0)
            }
        }
    }

    @usableFromInline let storage: Storage
    @usableFromInline let core: RecursiveMutex

    /// A new, unlocked recursive lock.
    public init() {
        let buffer = Storage.create(minimumCapacity: FutexMutex.wordCount) { _ in Header(owner: 0, depth: 0) }
        storage = unsafeDowncast(buffer, to: Storage.self)
        let words = storage.withUnsafeMutablePointerToElements { $0 }
        words.initialize(repeating: 0, count: FutexMutex.wordCount)
        let header = storage.withUnsafeMutablePointerToHeader { UnsafeMutableRawPointer($0) }
        core = RecursiveMutex(
            words: words,
            owner: (header + MemoryLayout<Header>.offset(of: \.owner)!).assumingMemoryBound(to: UInt.self),
            depth: (header + MemoryLayout<Header>.offset(of: \.depth)!).assumingMemoryBound(to: Int.self))
        LockHooks.tsanCreated(words)
    }

    /// A name for the lock, for people reading diagnostics (Foundation's
    /// `NSRecursiveLock.name`): shown in `description` and in the message with which
    /// misuse stops the process. `nil` (the default) for none. Settable on
    /// any copy of the handle, from any thread; every copy sees it.
    ///
    /// Kept in a side table, not in the lock (see `LockNames` in the
    /// sources): an unnamed lock is no bigger and `lock()`/`unlock()` never reads
    /// the name. Reading or setting it takes that table's lock (it blocks
    /// only for another name's read or write) and orders nothing else.
    public var name: String? {
        get { LockNames.name(at: core.mutex.word) }
        nonmutating set { LockNames.setName(newValue, at: core.mutex.word) }
    }

    /// Whether the calling thread holds the lock. Never blocks.
    @inlinable
    public var isHeldByCurrentThread: Bool { core.isHeldByCurrentThread }

    /// The raw lock word, for tests and diagnostics: 0 when idle.
    package var wordValue: UInt32 { AtomicMemory.load(from: core.mutex.word, ordering: .relaxed) }

    /// Acquires the lock, or deepens it if this thread already holds it.
    /// Blocks while another thread holds it.
    @inlinable
    public func lock() {
        LockHooks.willLock(core.mutex.word, .recursiveLock)
        core.lock()
    }

    /// Acquires or deepens the lock if possible without blocking.
    @inlinable
    public func tryLock() -> Bool {
        guard core.tryLock() else { return false }
        LockHooks.didTryLock(core.mutex.word, .recursiveLock)
        return true
    }

    /// Acquires or deepens the lock, blocking at most until `deadline`.
    @inlinable
    public func lock(before deadline: MonotonicClock.Instant) -> Bool {
        LockHooks.willLock(core.mutex.word, .recursiveLock)
        guard core.lock(before: deadline) else {
            LockHooks.lockFailed(core.mutex.word, .recursiveLock)
            return false
        }
        return true
    }

    /// Undoes one `lock()`; the last one releases the lock to other threads.
    /// Never blocks. Stops the process with a message when the calling thread
    /// does not hold the lock.
    @inlinable
    public func unlock() {
        LockHooks.willUnlock(core.mutex.word, .recursiveLock)
        core.unlock()
    }
}

/// The recursive lock algorithm behind `RecursiveLock` and `synchronized`,
/// on words kept at stable addresses by its owner: a `FutexMutex` plus the
/// holder's identity and depth. Pointers only, so a table of them (the
/// `synchronized` stripes) can be read without reference counting.
@usableFromInline
struct RecursiveMutex {
    @usableFromInline let mutex: FutexMutex
    @usableFromInline let owner: UnsafeMutablePointer<UInt>
    @usableFromInline let depth: UnsafeMutablePointer<Int>

    @inlinable
    init(
        words: UnsafeMutablePointer<UInt32>, owner: UnsafeMutablePointer<UInt>, depth: UnsafeMutablePointer<Int>
    ) {
        mutex = FutexMutex(words: words)
        self.owner = owner
        self.depth = depth
    }

    /// The calling thread's identity.
    @inlinable
    static var me: UInt { UInt(bitPattern: Int(bitPattern: pthread_self())) }

    @inlinable
    var isHeldByCurrentThread: Bool {
        // Relaxed is enough: only this thread ever stores its own identity.
        AtomicMemory.load(from: owner, ordering: .relaxed) == Self.me
    }

    @inlinable
    func lock() {
        let me = Self.me
        if AtomicMemory.load(from: owner, ordering: .relaxed) == me {
            depth.pointee += 1
            return
        }
        mutex.lock()
        took(me)
    }

    @inlinable
    func tryLock() -> Bool {
        let me = Self.me
        if AtomicMemory.load(from: owner, ordering: .relaxed) == me {
            depth.pointee += 1
            return true
        }
        guard mutex.tryLock() else { return false }
        took(me)
        return true
    }

    @inlinable
    func lock(before deadline: MonotonicClock.Instant) -> Bool {
        let me = Self.me
        if AtomicMemory.load(from: owner, ordering: .relaxed) == me {
            depth.pointee += 1
            return true
        }
        guard mutex.lock(before: deadline) else { return false }
        took(me)
        return true
    }

    @inlinable
    func unlock() {
        require(
            AtomicMemory.load(from: owner, ordering: .relaxed) == Self.me,
            "\(LockNames.label("RecursiveLock", mutex.word)).unlock(): the calling thread does not hold this lock (unlocked on another thread, or more unlocks than locks)")
        depth.pointee -= 1
        if depth.pointee == 0 {
            AtomicMemory.store(0, to: owner, ordering: .relaxed)
            mutex.unlock()
        }
    }

    @inlinable
    func took(_ me: UInt) {
        AtomicMemory.store(me, to: owner, ordering: .relaxed)
        depth.pointee = 1
    }
}

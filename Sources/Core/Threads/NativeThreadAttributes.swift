import CShims

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

extension NativeThread {
    /// How the kernel schedules a thread.
    ///
    /// Leave priorities alone unless a measurement says otherwise: raising one
    /// thread starves the others, and a starved low-priority thread that holds
    /// a lock stalls the high-priority thread waiting for it.
    public enum Priority: Sendable, Hashable, CustomStringConvertible {
        /// The normal time-sharing policy (`SCHED_OTHER`) at a nice value
        /// chosen by a number from 0.0 (lowest) to 1.0 (highest), the scale of
        /// Foundation's `Thread.threadPriority`. 0.5 is the default, nice 0;
        /// 0.0 maps to nice 19 and 1.0 to nice -20, linearly on each side of
        /// 0.5. Lowering is always allowed; going above the thread's current
        /// priority needs `CAP_SYS_NICE` or a suitable `RLIMIT_NICE`.
        case relative(Double)
        /// The real-time first-in-first-out policy (`SCHED_FIFO`) at a static
        /// priority of 1...99: the thread runs until it blocks or yields,
        /// ahead of every time-sharing thread. Needs `CAP_SYS_NICE` or
        /// `RLIMIT_RTPRIO`.
        case fifo(Int)
        /// The real-time round-robin policy (`SCHED_RR`): as `fifo`, but
        /// threads of equal priority take turns in time slices.
        case roundRobin(Int)

        /// The default: `SCHED_OTHER` at nice 0.
        public static var normal: Priority { .relative(0.5) }

        /// The policy and value, with the nice value for a relative priority.
        public var description: String {
            switch self {
            case .relative(let value): "relative(\(value), nice \(Priority.niceValue(forRelative: value)))"
            case .fifo(let value): "SCHED_FIFO \(value)"
            case .roundRobin(let value): "SCHED_RR \(value)"
            }
        }

        /// The nice value for a relative priority in 0.0...1.0: 19 at 0.0, 0 at
        /// 0.5, -20 at 1.0. Linux's nice range is asymmetric (19 above 0, 20
        /// below), so each half is scaled on its own.
        static func niceValue(forRelative value: Double) -> Int32 {
            if value <= 0.5 { return Int32(((0.5 - value) * 38).rounded()) }
            return -Int32(((value - 0.5) * 40).rounded())
        }

        /// The relative priority whose nice value is `nice` (the inverse of
        /// `niceValue(forRelative:)` for every nice value from -20 to 19).
        static func relative(forNice nice: Int32) -> Double {
            nice >= 0 ? 0.5 - Double(nice) / 38 : 0.5 - Double(nice) / 40
        }

        /// Checks the value; returns the policy and the static priority for
        /// the kernel.
        func validated() throws(NativeThreadError) -> (policy: Int32, priority: Int32, nice: Int32?) {
            switch self {
            case .relative(let value):
                guard value >= 0, value <= 1 else { throw .priorityOutOfRange(value) }
                return (Int32(SCHED_OTHER), 0, Priority.niceValue(forRelative: value))
            case .fifo(let value):
                return (Int32(SCHED_FIFO), try Priority.checkRealtime(value, policy: Int32(SCHED_FIFO)), nil)
            case .roundRobin(let value):
                return (Int32(SCHED_RR), try Priority.checkRealtime(value, policy: Int32(SCHED_RR)), nil)
            }
        }

        private static func checkRealtime(_ value: Int, policy: Int32) throws(NativeThreadError) -> Int32 {
            let low = Int(cshims_sched_priority_min(policy))
            let high = Int(cshims_sched_priority_max(policy))
            // The kernel always knows SCHED_FIFO and SCHED_RR; 1...99 is its
            // fixed range should the query fail anyway.
            let range = (low >= 0 && high >= low) ? low...high : 1...99
            guard range.contains(value) else { throw .realtimePriorityOutOfRange(requested: value, allowed: range) }
            return Int32(value)
        }
    }

    /// What a new thread is given before it starts: its name, stack, whether
    /// it can be joined, its scheduling, the CPUs it may run on and its NUMA
    /// node. Every field defaults to "as the platform does it".
    ///
    /// Values are checked by `validate()`, which `SpawnedThread.start()` calls
    /// before any system call; a value the platform cannot honour throws a
    /// specific `NativeThreadError` and is never rounded or clamped. What the
    /// kernel may still refuse (a real-time policy without privilege, a CPU set
    /// a container excludes) throws from `start()`.
    public struct Attributes: Sendable {
        /// The thread's name as `ps`, `top` and debuggers show it: at most 15
        /// bytes of UTF-8 (Linux's `comm` field). Applied by the thread itself
        /// (`prctl(PR_SET_NAME)`) before its body runs, and `start()` returns
        /// only once it is applied, so the thread has this name from then
        /// on (until it renames itself). `nil` keeps the name the thread
        /// inherits (the process's).
        public var name: String?

        /// Bytes reserved for the stack: at least `Topology.minimumStackSize`
        /// and a multiple of `Topology.pageSize`. Only touched pages become
        /// resident. `nil` is glibc's default, derived from `RLIMIT_STACK`
        /// (`Topology.defaultStackSize`, usually 8 MiB). glibc takes a guard
        /// page and the thread's descriptor and static TLS out of this size.
        public var stackSize: Int?

        /// A detached thread cannot be joined: its resources go back to the
        /// system as soon as its body returns, its result is discarded, and an
        /// error it throws goes to `onDetachedError`. The default, a joinable
        /// thread, must be joined (or its `SpawnedThread` released, which
        /// detaches it).
        public var isDetached: Bool

        /// Scheduling policy and priority; `nil` inherits the creating
        /// thread's (glibc's `PTHREAD_INHERIT_SCHED`) and nice value.
        public var priority: Priority?

        /// The CPUs the thread may run on, by id (see `Topology.onlineCPUs`);
        /// `nil` inherits the creating thread's set.
        public var affinity: Set<Int>?

        /// A NUMA node to run on and take memory from: the thread is limited
        /// to the node's CPUs (intersected with `affinity`, which must then
        /// lie on the node) and its allocations prefer the node's memory.
        /// Node 0 always exists; see `Topology.numaNodes`.
        public var numaNode: Int?

        /// Called on a detached thread, with the error and the thread, when
        /// its body throws. `nil` writes the error and the thread's name to
        /// standard error: an error is never dropped silently.
        public var onDetachedError: (@Sendable (any Error, NativeThread) -> Void)?

        /// Attributes; every argument defaults to the platform's behaviour.
        public init(
            name: String? = nil,
            stackSize: Int? = nil,
            isDetached: Bool = false,
            priority: Priority? = nil,
            affinity: Set<Int>? = nil,
            numaNode: Int? = nil,
            onDetachedError: (@Sendable (any Error, NativeThread) -> Void)? = nil
        ) {
            self.name = name
            self.stackSize = stackSize
            self.isDetached = isDetached
            self.priority = priority
            self.affinity = affinity
            self.numaNode = numaNode
            self.onDetachedError = onDetachedError
        }

        /// Checks every value against this machine and throws the first
        /// problem: stack size (minimum, then page multiple), name, priority,
        /// affinity (each CPU online), NUMA node (exists; affinity on it).
        /// Does not block; makes no system call after the first use (the
        /// topology is read once per process).
        public func validate() throws(NativeThreadError) {
            _ = try launchPlan()
        }

        /// Whether the thread can be created with no `pthread_attr_t` at all
        /// and nothing to apply on it: the fast path of `start()`.
        var isPlatformDefault: Bool {
            name == nil && stackSize == nil && priority == nil && affinity == nil && numaNode == nil
        }

        /// Whether the new thread applies settings to itself that the kernel
        /// may refuse (a nice value, a NUMA memory policy) or that must hold
        /// when `start()` returns (its name), so that `start()` waits for its
        /// verdict.
        var needsSetupOnThread: Bool {
            if case .relative? = priority { return true }
            return numaNode != nil || name != nil
        }

        /// The validated values, in the form the system calls take.
        func launchPlan() throws(NativeThreadError) -> LaunchPlan {
            var plan = LaunchPlan()
            if let stackSize {
                let minimum = Topology.minimumStackSize
                guard stackSize >= minimum else { throw .stackSizeTooSmall(requested: stackSize, minimum: minimum) }
                let page = Topology.pageSize
                guard stackSize % page == 0 else { throw .stackSizeNotPageMultiple(requested: stackSize, pageSize: page) }
                plan.stackSize = stackSize
            }
            if let name { try NativeThread.checkName(name) }
            if let priority {
                let (policy, value, _) = try priority.validated()
                plan.policy = (policy, value)
                plan.policyName = priority.description
            }
            var cpus: [Int]? = nil
            if let affinity {
                cpus = try Topology.checkCPUs(affinity)
            }
            if let numaNode {
                let node = try Topology.checkNode(numaNode)
                if let chosen = cpus {
                    let outside = chosen.filter { !node.cpus.contains($0) }
                    if !outside.isEmpty {
                        throw .cpusOutsideNode(cpus: chosen, node: numaNode, nodeCPUs: node.cpus)
                    }
                } else if !node.cpus.isEmpty {
                    // A node with memory but no CPUs (e.g. CXL memory) cannot
                    // be run on; only the memory preference applies.
                    cpus = node.cpus
                }
            }
            plan.cpus = cpus
            return plan
        }
    }

    /// Validated attributes in the kernel's terms.
    struct LaunchPlan {
        var stackSize: Int?
        /// Explicit scheduling (`PTHREAD_EXPLICIT_SCHED`): policy and static priority.
        var policy: (policy: Int32, priority: Int32)?
        /// The CPUs the thread may run on, ascending.
        var cpus: [Int]?
        /// A description of the policy, for errors.
        var policyName: String?

        /// Steps that need a `pthread_attr_t`.
        var needsAttributes: Bool { stackSize != nil || policy != nil || cpus != nil }
    }
}

extension NativeThread {
    /// The most bytes of a thread name Linux keeps (its `comm` field is 16
    /// bytes, the last one the NUL).
    public static let nameLimit = 15

    static func checkName(_ name: String) throws(NativeThreadError) {
        let bytes = name.utf8.count
        guard bytes <= nameLimit else { throw .nameTooLong(bytes: bytes, limit: nameLimit) }
        guard !name.utf8.contains(0) else { throw .nameContainsNUL }
    }
}

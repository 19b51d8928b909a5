import CShims
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The thread, CPU and NUMA shims. This machine may have one NUMA node or
/// none reported; both must work.
@Suite("CShims: threads, CPUs, NUMA")
struct SystemShimTests {
    @Test func threadIdAndCPUs() {
        #expect(cshims_gettid() > 0)
        let online = cshims_cpu_count_online()
        let configured = cshims_cpu_count_configured()
        #expect(online >= 1 && configured >= online)
        let cpu = cshims_current_cpu()
        #expect(cpu >= 0 && cpu < configured)
        #expect(cshims_page_size() >= 4096)
    }

    @Test func affinityRoundTrip() {
        var mask = [UInt64](repeating: 0, count: 16)
        #expect(cshims_affinity_get(0, &mask, mask.count) == 0)
        let allowed = mask.enumerated().reduce(0) { $0 + $1.element.nonzeroBitCount }
        #expect(allowed >= 1)
        // Setting the same mask back is always permitted.
        #expect(cshims_affinity_set(0, mask, mask.count) == 0)
        // An empty set is refused with EINVAL, not a crash.
        let empty = [UInt64](repeating: 0, count: 16)
        #expect(cshims_affinity_set(0, empty, empty.count) == -EINVAL)
        // A thread that does not exist.
        #expect(cshims_affinity_get(Int32.max, &mask, mask.count) == -ESRCH)
    }

    @Test func numaOneNodeOrMore() {
        let nodes = cshims_numa_node_count()
        #expect(nodes >= 1)
        #expect(cshims_numa_node_of_cpu(0) >= 0)
        #expect(cshims_numa_node_of_cpu(-1) == -EINVAL)
        #expect(cshims_numa_node_of_cpu(1 << 20) == -EINVAL)

        var error: Int32 = 1
        let size = 1 << 16
        let p = cshims_numa_alloc_on_node(size, 0, &error)
        #expect(p != nil && error == 0)
        if let p {
            p.storeBytes(of: 0xAB, as: UInt8.self)
            p.storeBytes(of: 0xCD, toByteOffset: size - 1, as: UInt8.self)
            cshims_numa_free(p, size)
        }
        #expect(cshims_numa_alloc_on_node(size, Int32(nodes) + 6, &error) == nil)
        #expect(error == -EINVAL)
        #expect(cshims_numa_alloc_on_node(0, 0, &error) == nil && error == -EINVAL)
        #expect(cshims_numa_run_on_node(Int32(nodes) + 6) == -EINVAL)
        #expect(cshims_numa_prefer_node(-1) == -EINVAL)
        #expect(cshims_numa_prefer_node(Int32(nodes) + 6) == -EINVAL)
    }

    @Test func numaRunOnNodeZeroOnAThread() {
        // Restricting a thread must not leak into the test runner's threads.
        var thread = pthread_t()
        var rc: Int32 = 99
        withUnsafeMutablePointer(to: &rc) { rcp in
            pthread_create(&thread, nil, { arg in
                let out = arg!.assumingMemoryBound(to: Int32.self)
                out.pointee = cshims_numa_run_on_node(0)
                if out.pointee == 0 { out.pointee = cshims_numa_prefer_node(0) }
                return nil
            }, rcp)
            pthread_join(thread, nil)
        }
        #expect(rc == 0)
    }
}

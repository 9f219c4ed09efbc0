#include "comm/group.h"

#include "comm/mpi_group.h"

namespace epmoe {

namespace {
Group* g_active = nullptr;
}

Group* active_group() { return g_active; }
void set_active_group(Group* g) { g_active = g; }

// MPI is the one transport that must be ended explicitly (the NCCL group ends with the process);
// MpiGroup::finalize() does nothing when MPI was never started.
void finalize_active_group() { MpiGroup::finalize(); }

}  // namespace epmoe

/* hetmem tests — the CUDA provider's own declarations of the driver API
 * (src/providers/cuda/cuda_api.h) against cuda.h: every constant's value,
 * every struct's size, and the type of every entry point the provider
 * resolves, by the exact symbol it resolves. A mismatch fails the build of
 * this file. Built only where cuda.h is found. SPDX-License-Identifier: MIT */
#include <cuda.h>

/* cuda.h maps the unversioned names to the versioned entry points with
 * macros; the driver exports the unversioned ones too, as the old calls
 * (32-bit sizes). Without the macros, an unversioned name in cuda_api.h's
 * list names nothing cuda.h declares: this file does not compile. */
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemAllocHost
#undef cuMemGetAddressRange
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuCtxDestroy
#undef cuCtxCreate
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuIpcOpenMemHandle
#undef cuMemcpyHtoD
#undef cuMemcpyDtoH
#undef cuMemcpyDtoD
#undef cuMemsetD8
#undef cuDeviceGetUuid
#undef cuDeviceTotalMem
#undef cuMemGetInfo
#undef cuGetProcAddress

#include "providers/cuda/cuda_api.h"

#include <stdio.h>

#define SAME(a, b) _Static_assert((long long)(a) == (long long)(b), #a " != " #b)
SAME(HM_CUDA_SUCCESS, CUDA_SUCCESS);
SAME(HM_CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE);
SAME(HM_CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY);
SAME(HM_CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED);
SAME(HM_CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
SAME(HM_CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE);
SAME(HM_CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT);
SAME(HM_CUDA_ERROR_ALREADY_MAPPED, CUDA_ERROR_ALREADY_MAPPED);
SAME(HM_CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED);
SAME(HM_CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE);
SAME(HM_CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_PERMITTED);
SAME(HM_CU_MEM_HANDLE_TYPE_NONE, CU_MEM_HANDLE_TYPE_NONE);
SAME(HM_CU_MEM_HANDLE_TYPE_FABRIC, CU_MEM_HANDLE_TYPE_FABRIC);
SAME(HM_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
     CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED);
SAME(sizeof(hm_cu_fabric_handle_t), sizeof(CUmemFabricHandle));
_Static_assert(__builtin_types_compatible_p(hm_cu_fabric_handle_t, CUmemFabricHandle),
               "CUmemFabricHandle");
SAME(HM_CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_CONTEXT);
SAME(HM_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
SAME(HM_CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_BUFFER_ID);
SAME(HM_CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_IS_MANAGED);
SAME(HM_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
SAME(HM_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
SAME(HM_CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_RANGE_SIZE);
SAME(HM_CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_HOST);
SAME(HM_CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE);
SAME(HM_CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_PORTABLE);
SAME(HM_CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_DEVICEMAP);
SAME(HM_CU_MEMHOSTALLOC_WRITECOMBINED, CU_MEMHOSTALLOC_WRITECOMBINED);
SAME(HM_CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_GLOBAL);
SAME(HM_CU_MEM_ATTACH_HOST, CU_MEM_ATTACH_HOST);
SAME(HM_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
SAME(HM_CU_IPC_HANDLE_SIZE, CU_IPC_HANDLE_SIZE);
SAME(sizeof(hm_cu_ipc_handle_t), sizeof(CUipcMemHandle));
SAME(sizeof(hm_cu_uuid_t), sizeof(CUuuid));
SAME(sizeof(hm_cu_ptr_t), sizeof(CUdeviceptr));
SAME(sizeof(hm_cu_device_t), sizeof(CUdevice));
SAME(sizeof(hm_cu_result_t), sizeof(CUresult));
SAME(sizeof(unsigned int), sizeof(CUpointer_attribute));
_Static_assert(__builtin_types_compatible_p(hm_cu_context_t, CUcontext), "CUcontext");
_Static_assert(__builtin_types_compatible_p(hm_cu_stream_t, CUstream), "CUstream");
_Static_assert(__builtin_types_compatible_p(hm_cu_ptr_t, CUdeviceptr), "CUdeviceptr");
SAME(HM_CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING);
SAME(HM_CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_PINNED);
SAME(HM_CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE);
SAME(HM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
SAME(HM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
SAME(HM_CU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
SAME(HM_CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);
SAME(HM_CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_DEINITIALIZED);
_Static_assert(__builtin_types_compatible_p(hm_cu_mem_handle_t, CUmemGenericAllocationHandle),
               "CUmemGenericAllocationHandle");
_Static_assert(__builtin_types_compatible_p(hm_cu_mem_prop_t, CUmemAllocationProp),
               "CUmemAllocationProp");
_Static_assert(__builtin_types_compatible_p(hm_cu_mem_access_t, CUmemAccessDesc),
               "CUmemAccessDesc");

/* The entry points: cuda.h's declaration of the exact symbol the provider
 * resolves has the very function type the provider calls it through
 * (cuda.h's enums are compatible with unsigned int, their underlying type). */
#define FN_TYPE(field, sym, ret, params)                                                     \
    _Static_assert(__builtin_types_compatible_p(__typeof__(sym), ret params), #sym);
HM_CU_FN(FN_TYPE)
HM_CU_FN_OPTIONAL(FN_TYPE)

int main(void) {
    puts("cuda_api.h agrees with cuda.h");
    return 0;
}

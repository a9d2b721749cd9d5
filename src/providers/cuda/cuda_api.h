/* hetmem — the part of the CUDA driver API the CUDA provider uses, declared
 * here so that hetmem builds without cuda.h. SPDX-License-Identifier: MIT
 *
 * Every type, constant and signature below is the driver's (cuda.h, CUDA
 * 13), under hetmem's own names. test/cuda/test_cuda_decls.c checks each
 * against cuda.h where that header is present: values, sizes and the
 * function types of the versioned entry points (HM_CU_FN lists them with
 * the exact names the driver exports). */
#ifndef HM_PROVIDERS_CUDA_API_H
#define HM_PROVIDERS_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

/* The driver's own struct tags, so that the test that includes cuda.h as
 * well compares the very types (it includes cuda.h first: CUDA_VERSION is
 * then defined and the structs are cuda.h's). An enum is its underlying
 * type here (unsigned int: the driver's enums have no negative values). */
typedef unsigned int hm_cu_result_t;        /* CUresult */
typedef int hm_cu_device_t;                 /* CUdevice */
typedef unsigned long long hm_cu_ptr_t;     /* CUdeviceptr (64-bit) */
typedef struct CUctx_st *hm_cu_context_t;   /* CUcontext */
typedef struct CUstream_st *hm_cu_stream_t; /* CUstream */
typedef struct CUevent_st *hm_cu_event_t;   /* CUevent */
#define HM_CU_IPC_HANDLE_SIZE 64
#ifndef CUDA_VERSION
struct CUuuid_st {
    char bytes[16];
};
struct CUipcMemHandle_st {
    char reserved[HM_CU_IPC_HANDLE_SIZE];
};
struct CUmemFabricHandle_st {
    unsigned char data[HM_CU_IPC_HANDLE_SIZE];
};
#endif
typedef struct CUuuid_st hm_cu_uuid_t;              /* CUuuid */
typedef struct CUipcMemHandle_st hm_cu_ipc_handle_t; /* CUipcMemHandle */
typedef struct CUmemFabricHandle_st hm_cu_fabric_handle_t; /* CUmemFabricHandle */

/* The virtual memory management API (cuMemCreate, cuMemMap, ...). */
typedef unsigned long long hm_cu_mem_handle_t; /* CUmemGenericAllocationHandle */
#ifndef CUDA_VERSION
struct CUmemLocation_st {
    unsigned int type; /* CUmemLocationType */
    int id;
};
struct CUmemAllocationProp_st {
    unsigned int type;                 /* CUmemAllocationType */
    unsigned int requestedHandleTypes; /* CUmemAllocationHandleType */
    struct CUmemLocation_st location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
};
struct CUmemAccessDesc_st {
    struct CUmemLocation_st location;
    unsigned int flags; /* CUmemAccess_flags */
};
#endif
typedef struct CUmemAllocationProp_st hm_cu_mem_prop_t; /* CUmemAllocationProp */
typedef struct CUmemAccessDesc_st hm_cu_mem_access_t;   /* CUmemAccessDesc */

enum {
    HM_CUDA_SUCCESS = 0,
    HM_CUDA_ERROR_INVALID_VALUE = 1,
    HM_CUDA_ERROR_OUT_OF_MEMORY = 2,
    HM_CUDA_ERROR_NOT_INITIALIZED = 3,
    HM_CUDA_ERROR_DEINITIALIZED = 4,
    HM_CUDA_ERROR_NO_DEVICE = 100,
    HM_CUDA_ERROR_INVALID_DEVICE = 101,
    HM_CUDA_ERROR_INVALID_CONTEXT = 201,
    HM_CUDA_ERROR_ALREADY_MAPPED = 208,
    HM_CUDA_ERROR_INVALID_HANDLE = 400,
    HM_CUDA_ERROR_NOT_READY = 600,
    HM_CUDA_ERROR_NOT_PERMITTED = 800,
    HM_CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* CUpointer_attribute */
enum {
    HM_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    HM_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    HM_CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
    HM_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    HM_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    HM_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    HM_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
};
/* CUmemorytype */
enum { HM_CU_MEMORYTYPE_HOST = 1, HM_CU_MEMORYTYPE_DEVICE = 2 };
/* cuMemHostAlloc flags, cuMemAllocManaged flags, cuIpcOpenMemHandle flags */
enum {
    HM_CU_MEMHOSTALLOC_PORTABLE = 0x01,
    HM_CU_MEMHOSTALLOC_DEVICEMAP = 0x02,
    HM_CU_MEMHOSTALLOC_WRITECOMBINED = 0x04,
    HM_CU_MEM_ATTACH_GLOBAL = 0x1,
    HM_CU_MEM_ATTACH_HOST = 0x2,
    HM_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1,
    HM_CU_EVENT_DISABLE_TIMING = 0x2,
    HM_CU_MEM_ALLOCATION_TYPE_PINNED = 0x1,
    HM_CU_MEM_LOCATION_TYPE_DEVICE = 0x1,
    HM_CU_MEM_HANDLE_TYPE_NONE = 0x0,
    HM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
    HM_CU_MEM_HANDLE_TYPE_FABRIC = 0x8,
    HM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3,
    HM_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
};

/* CUdevice_attribute */
enum { HM_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 128 };

/* X(field, exported symbol, return type, parameters), required entry points. */
#define HM_CU_FN(X)                                                                           \
    X(Init, cuInit, hm_cu_result_t, (unsigned int flags))                                   \
    X(DeviceGet, cuDeviceGet, hm_cu_result_t, (hm_cu_device_t *device, int ordinal))        \
    X(DeviceGetCount, cuDeviceGetCount, hm_cu_result_t, (int *count))                       \
    X(DeviceGetUuid, cuDeviceGetUuid_v2, hm_cu_result_t,                                    \
      (hm_cu_uuid_t *uuid, hm_cu_device_t dev))                                               \
    X(DeviceCanAccessPeer, cuDeviceCanAccessPeer, hm_cu_result_t,                           \
      (int *can, hm_cu_device_t dev, hm_cu_device_t peer))                                    \
    X(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, hm_cu_result_t,                     \
      (hm_cu_context_t *pctx, hm_cu_device_t dev))                                            \
    X(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, hm_cu_result_t,                \
      (hm_cu_device_t dev))                                                                   \
    X(CtxGetCurrent, cuCtxGetCurrent, hm_cu_result_t, (hm_cu_context_t *pctx))              \
    X(CtxPushCurrent, cuCtxPushCurrent_v2, hm_cu_result_t, (hm_cu_context_t ctx))           \
    X(CtxPopCurrent, cuCtxPopCurrent_v2, hm_cu_result_t, (hm_cu_context_t *pctx))           \
    X(CtxGetDevice, cuCtxGetDevice, hm_cu_result_t, (hm_cu_device_t *device))               \
    X(MemAlloc, cuMemAlloc_v2, hm_cu_result_t, (hm_cu_ptr_t *dptr, size_t bytesize))        \
    X(MemFree, cuMemFree_v2, hm_cu_result_t, (hm_cu_ptr_t dptr))                            \
    X(MemHostAlloc, cuMemHostAlloc, hm_cu_result_t,                                         \
      (void **pp, size_t bytesize, unsigned int flags))                                       \
    X(MemFreeHost, cuMemFreeHost, hm_cu_result_t, (void *p))                                \
    X(MemAllocManaged, cuMemAllocManaged, hm_cu_result_t,                                   \
      (hm_cu_ptr_t *dptr, size_t bytesize, unsigned int flags))                               \
    X(MemGetAddressRange, cuMemGetAddressRange_v2, hm_cu_result_t,                          \
      (hm_cu_ptr_t *pbase, size_t *psize, hm_cu_ptr_t dptr))                                  \
    X(MemsetD8, cuMemsetD8_v2, hm_cu_result_t,                                              \
      (hm_cu_ptr_t dst, unsigned char uc, size_t n))                                          \
    X(Memcpy, cuMemcpy, hm_cu_result_t, (hm_cu_ptr_t dst, hm_cu_ptr_t src, size_t n))      \
    X(StreamSynchronize, cuStreamSynchronize, hm_cu_result_t, (hm_cu_stream_t stream))      \
    X(PointerGetAttributes, cuPointerGetAttributes, hm_cu_result_t,                         \
      (unsigned int n, unsigned int *attributes, void **data, hm_cu_ptr_t ptr))                        \
    X(IpcGetMemHandle, cuIpcGetMemHandle, hm_cu_result_t,                                   \
      (hm_cu_ipc_handle_t *handle, hm_cu_ptr_t dptr))                                         \
    X(IpcOpenMemHandle, cuIpcOpenMemHandle_v2, hm_cu_result_t,                              \
      (hm_cu_ptr_t *pdptr, hm_cu_ipc_handle_t handle, unsigned int flags))                    \
    X(IpcCloseMemHandle, cuIpcCloseMemHandle, hm_cu_result_t, (hm_cu_ptr_t dptr))

/* Optional. */
#define HM_CU_FN_OPTIONAL(X)                                                                  \
    X(GetErrorName, cuGetErrorName, hm_cu_result_t, (hm_cu_result_t error, const char **str)) \
    X(MemHostGetDevicePointer, cuMemHostGetDevicePointer_v2, hm_cu_result_t,                \
      (hm_cu_ptr_t *pdptr, void *p, unsigned int flags))                                      \
    X(EventCreate, cuEventCreate, hm_cu_result_t, (hm_cu_event_t *ev, unsigned int flags))  \
    X(EventRecord, cuEventRecord, hm_cu_result_t, (hm_cu_event_t ev, hm_cu_stream_t stream)) \
    X(EventQuery, cuEventQuery, hm_cu_result_t, (hm_cu_event_t ev))                         \
    X(EventSynchronize, cuEventSynchronize, hm_cu_result_t, (hm_cu_event_t ev))             \
    X(EventDestroy, cuEventDestroy_v2, hm_cu_result_t, (hm_cu_event_t ev))                  \
    X(MemGetAllocationGranularity, cuMemGetAllocationGranularity, hm_cu_result_t,           \
      (size_t *granularity, const hm_cu_mem_prop_t *prop, unsigned int option))              \
    X(MemCreate, cuMemCreate, hm_cu_result_t,                                               \
      (hm_cu_mem_handle_t *handle, size_t size, const hm_cu_mem_prop_t *prop,                \
       unsigned long long flags))                                                            \
    X(MemRelease, cuMemRelease, hm_cu_result_t, (hm_cu_mem_handle_t handle))                \
    X(MemAddressReserve, cuMemAddressReserve, hm_cu_result_t,                               \
      (hm_cu_ptr_t *ptr, size_t size, size_t alignment, hm_cu_ptr_t addr,                   \
       unsigned long long flags))                                                            \
    X(MemAddressFree, cuMemAddressFree, hm_cu_result_t, (hm_cu_ptr_t ptr, size_t size))     \
    X(MemMap, cuMemMap, hm_cu_result_t,                                                     \
      (hm_cu_ptr_t ptr, size_t size, size_t offset, hm_cu_mem_handle_t handle,               \
       unsigned long long flags))                                                            \
    X(MemUnmap, cuMemUnmap, hm_cu_result_t, (hm_cu_ptr_t ptr, size_t size))                 \
    X(MemSetAccess, cuMemSetAccess, hm_cu_result_t,                                         \
      (hm_cu_ptr_t ptr, size_t size, const hm_cu_mem_access_t *desc, size_t count))          \
    X(MemRetainAllocationHandle, cuMemRetainAllocationHandle, hm_cu_result_t,               \
      (hm_cu_mem_handle_t *handle, void *addr))                                               \
    X(MemExportToShareableHandle, cuMemExportToShareableHandle, hm_cu_result_t,             \
      (void *shareable, hm_cu_mem_handle_t handle, unsigned int type, unsigned long long flags)) \
    X(MemImportFromShareableHandle, cuMemImportFromShareableHandle, hm_cu_result_t,         \
      (hm_cu_mem_handle_t *handle, void *os_handle, unsigned int type))                       \
    X(MemGetAllocationPropertiesFromHandle, cuMemGetAllocationPropertiesFromHandle,         \
      hm_cu_result_t, (hm_cu_mem_prop_t *prop, hm_cu_mem_handle_t handle))                    \
    X(DeviceGetAttribute, cuDeviceGetAttribute, hm_cu_result_t,                             \
      (int *value, unsigned int attribute, hm_cu_device_t dev))

#endif

// Prototypes of the driver entry points, as this library defines them (CUresult
// and the enums passed as int, which is their ABI). For the driver's own test
// programs (tests/driver_*.cpp), which call the API directly.
#pragma once
#include "cuda_api.h"

#ifdef __cplusplus
extern "C" {
#endif
int cuInit(unsigned flags);
int cuDriverGetVersion(int* v);
int cuGetExportTable(const void** table, const void* uuid);
int cuGetErrorName(int error, const char** s);
int cuGetErrorString(int error, const char** s);
int cuDeviceGetCount(int* n);
int cuDeviceGet(CUdevice* d, int ordinal);
int cuDeviceGetName(char* name, int len, CUdevice d);
int cuDeviceGetAttribute(int* v, int attrib, CUdevice d);
int cuDeviceTotalMem_v2(size_t* bytes, CUdevice d);
int cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d);
int cuDevicePrimaryCtxRelease_v2(CUdevice d);
int cuDevicePrimaryCtxReset_v2(CUdevice d);
int cuCtxSetCurrent(CUcontext c);
int cuCtxGetCurrent(CUcontext* c);
int cuCtxPushCurrent_v2(CUcontext c);
int cuCtxPopCurrent_v2(CUcontext* c);
int cuCtxSynchronize(void);
int cuMemAlloc_v2(CUdeviceptr* p, size_t n);
int cuMemFree_v2(CUdeviceptr p);
int cuMemAllocAsync(CUdeviceptr* p, size_t n, CUstream s);
int cuMemFreeAsync(CUdeviceptr p, CUstream s);
int cuMemHostAlloc(void** p, size_t n, unsigned flags);
int cuMemAllocHost_v2(void** p, size_t n);
int cuMemFreeHost(void* p);
int cuMemcpyHtoD_v2(CUdeviceptr d, const void* s, size_t n);
int cuMemcpyDtoH_v2(void* d, CUdeviceptr s, size_t n);
int cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n);
int cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* s, size_t n, CUstream st);
int cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr s, size_t n, CUstream st);
int cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st);
int cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n);
int cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream st);
int cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream st);
int cuStreamCreate(CUstream* s, unsigned flags);
int cuStreamDestroy_v2(CUstream s);
int cuStreamSynchronize(CUstream s);
int cuStreamQuery(CUstream s);
int cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags);
int cuLaunchHostFunc(CUstream s, CUhostFn fn, void* user);
int cuEventCreate(CUevent* e, unsigned flags);
int cuEventDestroy_v2(CUevent e);
int cuEventRecord(CUevent e, CUstream s);
int cuEventQuery(CUevent e);
int cuEventSynchronize(CUevent e);
int cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b);
int cuModuleLoadData(CUmodule* m, const void* image);
int cuModuleUnload(CUmodule m);
int cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name);
int cuFuncGetParamInfo(CUfunction f, size_t i, size_t* off, size_t* size);
int cuFuncGetParamCount(CUfunction f, size_t* count);
int cuFuncGetAttribute(int* v, int attrib, CUfunction f);
int cuFuncSetAttribute(CUfunction f, int attrib, int v);
int cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, CUstream s, void** params, void** extra);
#ifdef __cplusplus
}
#endif

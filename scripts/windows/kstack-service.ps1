#Requires -RunAsAdministrator
<#
.SYNOPSIS
    Installs, starts, stops and removes the kstack kernel service with
    sc.exe, and explains the errors sc.exe reports.

.DESCRIPTION
    -Action create : sc.exe create kstack type= kernel start= demand
                     binPath= <package>\kstack.sys, and optionally
                     Parameters\RingCapacity and StackTableEntries.
    -Action start  : sc.exe start kstack (DriverEntry runs).
    -Action stop   : sc.exe stop kstack (DriverUnload runs), then shows
                     Parameters\LastUnloadPoolAllocations (0 expected).
    -Action delete : stops kstack if it runs, then sc.exe delete kstack.
    -Action status : the service's state and path, its Parameters values,
                     DisablePagingExecutive, and kstack.exe status.

    The errors people meet: 577 (kstack.sys is not signed, or test signing
    is off, or Secure Boot is on), 1275 (blocked by Memory integrity or
    another policy), 2 (binPath wrong), 5 (not elevated), 1060 (not
    installed), 1073 (installed already). Each is explained when it happens.

    Keep the package on a local disk: the kernel does not load a driver from
    a network share or a VM shared folder.

.PARAMETER Action
    create, start, stop, delete or status.

.PARAMETER RingCapacity
    With create: the ring's size in KiB, over all its per-processor shards
    (16 to 147456, that is 16 KiB to 144 MiB; the driver uses 9216, 9 MiB,
    when unset). Records take 72 bytes plus 8 per frame, so how many fit
    depends on the stacks' depths. Read when the driver starts.

.PARAMETER StackTableEntries
    With create: the stack table's entries (0 turns the table off and every
    record carries its frames; the driver uses 4096 when unset and brings
    other values down to a power of two, at most 65536). Each entry takes
    544 bytes of non-paged pool. Read when the driver starts.

.PARAMETER PackageDir
    The package folder (default: the folder above this script, else the
    repository's target\kstack-package).

.EXAMPLE
    .\kstack-service.ps1 -Action create -RingCapacity 65536

    Installs the service with a 64 MiB ring (65536 KiB).

.EXAMPLE
    .\kstack-service.ps1 -Action start
#>
[CmdletBinding()]
param(
    [Parameter(Mandatory = $true)]
    [ValidateSet('create', 'start', 'stop', 'delete', 'status')]
    [string] $Action,
    [ValidateRange(16, 147456)]
    [int] $RingCapacity,
    [ValidateRange(0, 65536)]
    [int] $StackTableEntries,
    [string] $PackageDir
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'
Import-Module (Join-Path $PSScriptRoot 'kstack-common.psm1') -Force

switch ($Action) {
    'create' {
        $package = Resolve-KStackPackage -PackageDir $PackageDir -ScriptRoot $PSScriptRoot
        $binary = Join-Path $package 'kstack.sys'
        $existing = Get-KStackDriver
        if ($existing) {
            Write-Host ('kstack is installed already: {0} ({1}).' -f $existing.PathName, $existing.State)
            Write-Host 'To install from this package: kstack-service.ps1 -Action delete, then -Action create.'
        } else {
            Invoke-Sc -Arguments @('create', 'kstack', 'type=', 'kernel', 'start=', 'demand', 'error=', 'normal', 'binPath=', $binary, 'DisplayName=', 'kstack kernel stack tracer') | Out-Null
        }
        if ($PSBoundParameters.ContainsKey('RingCapacity')) {
            Set-KStackRingCapacity -KiB $RingCapacity
        }
        if ($PSBoundParameters.ContainsKey('StackTableEntries')) {
            Set-KStackParameter -Name 'StackTableEntries' -Value $StackTableEntries
            Write-Host ('Parameters\StackTableEntries = {0} (0: the table is off; read when the driver starts).' -f $StackTableEntries)
        }
        Write-Host 'Next: kstack-service.ps1 -Action start'
    }
    'start' {
        $code = Invoke-Sc -Arguments @('start', 'kstack') -Allow @(1056)
        Wait-KStackState -State Running
        Write-Host ('kstack is running{0}.' -f $(if ($code -eq 1056) { ' (it was already)' } else { '' }))
    }
    'stop' {
        $code = Stop-KStackDriver
        if ($code -eq 0) {
            $left = Get-KStackParameter -Name 'LastUnloadPoolAllocations'
            if ($null -eq $left) {
                Write-Warning 'kstack stopped, but Parameters\LastUnloadPoolAllocations was not written: is this a kstack build that records it?'
            } elseif ($left -ne 0) {
                Write-Warning ('DriverUnload left {0} pool allocations behind: report this with the Verifier output.' -f $left)
            } else {
                Write-Host 'kstack stopped; its unload freed every pool allocation (LastUnloadPoolAllocations 0).'
            }
        }
    }
    'delete' {
        $driver = Get-KStackDriver
        if ($driver -and $driver.State -eq 'Running') {
            Stop-KStackDriver | Out-Null
        }
        $code = Invoke-Sc -Arguments @('delete', 'kstack') -Allow @(1060)
        if ($code -eq 0) {
            Write-Host 'kstack service deleted (its Parameters key went with it).'
        }
    }
    'status' {
        $driver = Get-KStackDriver
        if (-not $driver) {
            Write-Host ('kstack is not installed. {0}' -f (Get-ScErrorExplanation -Code 1060))
            break
        }
        Write-Host ('Service:    kstack, {0}, start mode {1}' -f $driver.State, $driver.StartMode)
        Write-Host ('Image:      {0}' -f $driver.PathName)
        Write-Host ('Parameters\RingCapacity: {0} (KiB; 9216 when unset)' -f (Get-KStackParameter -Name 'RingCapacity'))
        Write-Host ('Parameters\StackTableEntries: {0} (4096 when unset; 0: off)' -f (Get-KStackParameter -Name 'StackTableEntries'))
        foreach ($name in @('AssumePagingExecutiveInEffect', 'LastUnloadPoolAllocations')) {
            Write-Host ('Parameters\{0}: {1}' -f $name, (Get-KStackParameter -Name $name))
        }
        $paging = Get-PagingExecutive
        Write-Host ('DisablePagingExecutive: {0} (1, in effect from the next boot, lets the timer source walk stacks; kstack status says whether it is in effect; see paging-executive.ps1)' -f $paging)
        if ($driver.State -eq 'Running') {
            $package = Resolve-KStackPackage -PackageDir $PackageDir -ScriptRoot $PSScriptRoot
            Write-Host (Invoke-KStack -PackageDir $package -Arguments @('status')).Output
        }
    }
}

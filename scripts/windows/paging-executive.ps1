#Requires -RunAsAdministrator
<#
.SYNOPSIS
    Shows, sets (-Enable) or removes (-Disable) DisablePagingExecutive, which
    kstack's timer source needs, and says when a reboot has applied it
    (-AssumeInEffect). The value takes effect from the next boot.

.DESCRIPTION
    The timer source samples stacks from a DPC, at DISPATCH_LEVEL, where a
    stack walk must not touch pageable memory. Windows keeps kernel-mode
    code and drivers resident only when
    HKLM\SYSTEM\CurrentControlSet\Control\Session Manager\Memory Management\DisablePagingExecutive
    is 1 at boot. kstack takes the value as in effect only when it is 1 and
    its key was last written before this boot, or when the service's
    Parameters\AssumePagingExecutiveInEffect is 1; otherwise enabling the
    timer source is refused with 0xE0B50001 (kstack.exe exit code 5) and
    elevated walks are counted as skipped. `kstack.exe status` shows which.

    Windows itself can write to the Memory Management key while it boots;
    then kstack cannot tell the value predates the boot and says "NOT in
    effect" even after a reboot. Only then, after rebooting with the value
    set, run this script with -AssumeInEffect and restart the driver.

    Use 1 only for a diagnosis session, on a test machine: it keeps all of
    the kernel's pageable code in memory. -Disable removes the value and the
    override again (Windows' default). Either way reboot, then restart
    kstack.

.PARAMETER Enable
    Set DisablePagingExecutive to 1 (and remove an old override: the new
    value needs a reboot before anything may assume it).

.PARAMETER Disable
    Remove DisablePagingExecutive and the override (paging allowed,
    Windows' default).

.PARAMETER AssumeInEffect
    Set Parameters\AssumePagingExecutiveInEffect=1: you state that this
    boot started with DisablePagingExecutive=1. Refused unless the value is
    1. Restart the driver to apply.

.PARAMETER Restart
    Reboot right away.

.EXAMPLE
    .\paging-executive.ps1

.EXAMPLE
    .\paging-executive.ps1 -Enable -Restart

.EXAMPLE
    .\paging-executive.ps1 -AssumeInEffect
#>
[CmdletBinding(DefaultParameterSetName = 'Show')]
param(
    [Parameter(ParameterSetName = 'Enable', Mandatory = $true)]
    [switch] $Enable,
    [Parameter(ParameterSetName = 'Disable', Mandatory = $true)]
    [switch] $Disable,
    [Parameter(ParameterSetName = 'Assume', Mandatory = $true)]
    [switch] $AssumeInEffect,
    [Parameter(ParameterSetName = 'Enable')]
    [Parameter(ParameterSetName = 'Disable')]
    [switch] $Restart
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'
Import-Module (Join-Path $PSScriptRoot 'kstack-common.psm1') -Force

$key = 'HKLM:\SYSTEM\CurrentControlSet\Control\Session Manager\Memory Management'
$override = 'AssumePagingExecutiveInEffect'
$current = Get-PagingExecutive
$assumed = Get-KStackParameter -Name $override
Write-Host ('DisablePagingExecutive is now: {0}' -f $(if ($null -eq $current) { 'not set (paging allowed)' } else { $current }))
Write-Host ('Parameters\{0}: {1}' -f $override, $(if ($null -eq $assumed) { 'not set' } else { $assumed }))
Write-Host ('This boot began at {0}' -f (Get-CimInstance -ClassName Win32_OperatingSystem).LastBootUpTime)

switch ($PSCmdlet.ParameterSetName) {
    'Show' {
        Write-Host 'Whether the driver takes it as in effect: .\kstack.exe status'
        return
    }
    'Enable' {
        Write-Warning 'DisablePagingExecutive=1 keeps pageable kernel code resident: for a diagnosis session on a test machine only. Remove it afterwards with -Disable.'
        New-ItemProperty -LiteralPath $key -Name 'DisablePagingExecutive' -PropertyType DWord -Value 1 -Force | Out-Null
        Remove-KStackParameter -Name $override
        Write-Host 'Set DisablePagingExecutive=1 for the next boot.'
    }
    'Disable' {
        Remove-ItemProperty -LiteralPath $key -Name 'DisablePagingExecutive' -ErrorAction SilentlyContinue
        Remove-KStackParameter -Name $override
        Write-Host 'Removed DisablePagingExecutive and the override (Windows default from the next boot).'
    }
    'Assume' {
        if ($current -ne 1) {
            throw 'DisablePagingExecutive is not 1: set it with -Enable -Restart first; the override applies only to the value 1.'
        }
        Set-KStackParameter -Name $override -Value 1
        Write-Host ('Set Parameters\{0}=1: the driver takes DisablePagingExecutive=1 as in effect from its next start (.\kstack-service.ps1 -Action stop, then -Action start).' -f $override)
        return
    }
}

if ($Restart) {
    Restart-Computer -Force
} else {
    Write-Host 'Reboot for it to take effect (Restart-Computer), then start kstack; .\kstack.exe status says whether it is in effect.'
}

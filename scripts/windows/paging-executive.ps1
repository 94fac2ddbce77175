#Requires -RunAsAdministrator
<#
.SYNOPSIS
    Shows, sets (-Enable) or removes (-Disable) DisablePagingExecutive, which
    kstack's timer source needs. Takes effect after a reboot.

.DESCRIPTION
    The timer source samples stacks from a DPC, at DISPATCH_LEVEL, where a
    stack walk must not touch pageable memory. Windows keeps kernel-mode
    code and drivers resident only when
    HKLM\SYSTEM\CurrentControlSet\Control\Session Manager\Memory Management\DisablePagingExecutive
    is 1. kstack reads it when it loads: without 1, enabling the timer source
    is refused with 0xE0B50001 (kstack.exe exit code 5) and elevated walks
    are counted as skipped.

    Use 1 only for a diagnosis session, on a test machine: it keeps all of
    the kernel's pageable code in memory. -Disable removes the value again
    (Windows' default). Either way reboot, then restart kstack.

.PARAMETER Enable
    Set DisablePagingExecutive to 1.

.PARAMETER Disable
    Remove DisablePagingExecutive (paging allowed, Windows' default).

.PARAMETER Restart
    Reboot right away.

.EXAMPLE
    .\paging-executive.ps1

.EXAMPLE
    .\paging-executive.ps1 -Enable -Restart
#>
[CmdletBinding(DefaultParameterSetName = 'Show')]
param(
    [Parameter(ParameterSetName = 'Enable', Mandatory = $true)]
    [switch] $Enable,
    [Parameter(ParameterSetName = 'Disable', Mandatory = $true)]
    [switch] $Disable,
    [Parameter(ParameterSetName = 'Enable')]
    [Parameter(ParameterSetName = 'Disable')]
    [switch] $Restart
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'
Import-Module (Join-Path $PSScriptRoot 'kstack-common.psm1') -Force

$key = 'HKLM:\SYSTEM\CurrentControlSet\Control\Session Manager\Memory Management'
$current = Get-PagingExecutive
Write-Host ('DisablePagingExecutive is now: {0}' -f $(if ($null -eq $current) { 'not set (paging allowed)' } else { $current }))

switch ($PSCmdlet.ParameterSetName) {
    'Show' {
        return
    }
    'Enable' {
        Write-Warning 'DisablePagingExecutive=1 keeps pageable kernel code resident: for a diagnosis session on a test machine only. Remove it afterwards with -Disable.'
        New-ItemProperty -LiteralPath $key -Name 'DisablePagingExecutive' -PropertyType DWord -Value 1 -Force | Out-Null
        Write-Host 'Set DisablePagingExecutive=1 for the next boot.'
    }
    'Disable' {
        Remove-ItemProperty -LiteralPath $key -Name 'DisablePagingExecutive' -ErrorAction SilentlyContinue
        Write-Host 'Removed DisablePagingExecutive (Windows default from the next boot).'
    }
}

if ($Restart) {
    Restart-Computer -Force
} else {
    Write-Host 'Reboot for it to take effect (Restart-Computer); kstack reads it when it starts.'
}

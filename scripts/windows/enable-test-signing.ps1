#Requires -RunAsAdministrator
<#
.SYNOPSIS
    Turns test signing on (or off with -Disable) so Windows loads a
    test-signed kstack.sys. Takes effect after a reboot.

.DESCRIPTION
    Runs `bcdedit /set testsigning on`. With test signing on, the kernel
    loads drivers signed with a test certificate (sign-driver.ps1); without
    it, sc.exe start fails with 577 (ERROR_INVALID_IMAGE_HASH). After the
    reboot the desktop shows "Test Mode" in a corner.

    Secure Boot keeps test signing off: bcdedit refuses ("The value is
    protected by Secure Boot policy"). On a Hyper-V test VM turn it off in
    the VM's Settings > Security (uncheck "Enable Secure Boot") while the VM
    is off; on other hypervisors in the VM's firmware settings.

    Only for test machines: test signing lets any test-signed driver load.

.PARAMETER Disable
    Turn test signing off again (bcdedit /set testsigning off).

.PARAMETER Restart
    Reboot right away instead of leaving it to you.

.EXAMPLE
    .\enable-test-signing.ps1 -Restart

.EXAMPLE
    .\enable-test-signing.ps1 -Disable
#>
[CmdletBinding()]
param(
    [switch] $Disable,
    [switch] $Restart
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'
Import-Module (Join-Path $PSScriptRoot 'kstack-common.psm1') -Force

if (-not $Disable) {
    $secureBoot = $false
    try {
        $secureBoot = Confirm-SecureBootUEFI
    } catch [System.PlatformNotSupportedException] {
        # A BIOS (not UEFI) machine has no Secure Boot.
        $secureBoot = $false
    } catch {
        Write-Warning ('Could not read the Secure Boot state ({0}); continuing.' -f $_.Exception.Message)
    }
    if ($secureBoot) {
        throw 'Secure Boot is on, and it keeps test signing off. Turn Secure Boot off (Hyper-V: VM Settings > Security > uncheck "Enable Secure Boot", with the VM off), boot, and run this again.'
    }
}

$value = 'on'
if ($Disable) {
    $value = 'off'
}
$result = Invoke-Native -FilePath 'bcdedit.exe' -Arguments @('/set', 'testsigning', $value)
if ($result.ExitCode -ne 0) {
    throw ("bcdedit /set testsigning {0} failed ({1}):`n{2}" -f $value, $result.ExitCode, $result.Text)
}
Write-Host ('Test signing is set {0} for the next boot.' -f $value)

if ($Restart) {
    Restart-Computer -Force
} else {
    Write-Host 'Reboot for it to take effect: Restart-Computer'
}

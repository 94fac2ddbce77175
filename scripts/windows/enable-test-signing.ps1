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

    BitLocker (on by itself on many Windows 11 machines with a TPM, a
    virtual TPM too) checks the boot configuration: after a testsigning
    change it asks for the recovery key at the next boot. When it protects
    the system drive, this script first suspends it for that one boot
    (like manage-bde -protectors -disable C: -RebootCount 1); it resumes by
    itself after that boot, sealed to the new configuration. Turning Secure
    Boot off or on is checked too, and happens outside Windows: suspend
    BitLocker before that yourself (docs/windows-test-vm.md, step 3).

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

# Win32_EncryptableVolume: locale-independent, and present wherever
# BitLocker or device encryption is (its namespace is missing elsewhere).
$volume = $null
try {
    $volume = Get-CimInstance -Namespace 'root\CIMV2\Security\MicrosoftVolumeEncryption' -ClassName 'Win32_EncryptableVolume' -Filter ("DriveLetter='{0}'" -f $env:SystemDrive) -ErrorAction Stop
} catch {
    Write-Host ('No BitLocker state for {0} ({1}): nothing to suspend.' -f $env:SystemDrive, $_.Exception.Message)
}
# ProtectionStatus 1: protected (0: off or already suspended).
if ($volume -and $volume.ProtectionStatus -eq 1) {
    $suspend = Invoke-CimMethod -InputObject $volume -MethodName 'DisableKeyProtectors' -Arguments @{ DisableCount = [uint32]1 }
    if ($suspend.ReturnValue -ne 0) {
        throw ('BitLocker protects {0} and could not be suspended (error 0x{1:X8}). Suspend it for one reboot yourself (manage-bde -protectors -disable {0} -RebootCount 1), or have the recovery key at hand, then run this again.' -f $env:SystemDrive, $suspend.ReturnValue)
    }
    Write-Host ('BitLocker protects {0}: suspended for the next boot, so that it does not ask for the recovery key; it resumes after that boot.' -f $env:SystemDrive)
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

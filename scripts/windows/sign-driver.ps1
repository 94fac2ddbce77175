#Requires -RunAsAdministrator
<#
.SYNOPSIS
    Test-signs kstack.sys (and kstack.cat, when the package has one) with the
    certificate install-test-certificate.ps1 made.

.DESCRIPTION
    Signs with SHA-256. Uses signtool.exe when the Windows SDK or WDK is
    installed (or -SignTool names it), else PowerShell's
    Set-AuthenticodeSignature, which signs PE files such as kstack.sys but
    not catalogs. kstack.cat only matters for the INF route
    (pnputil /add-driver); sc.exe loads kstack.sys by its own signature.

    Sign again after every rebuild: a new kstack.sys has no signature, and
    sc.exe start then fails with 577.

.PARAMETER Subject
    The signing certificate's subject in Cert:\LocalMachine\My
    (default: CN=kstack test signing).

.PARAMETER Thumbprint
    Pick the certificate by thumbprint instead.

.PARAMETER SignTool
    Path of signtool.exe (default: on PATH, else the newest under
    Windows Kits\10\bin).

.PARAMETER PackageDir
    The package folder (default: the folder above this script, else the
    repository's target\kstack-package).

.EXAMPLE
    .\sign-driver.ps1
#>
[CmdletBinding()]
param(
    [string] $Subject = 'CN=kstack test signing',
    [string] $Thumbprint,
    [string] $SignTool,
    [string] $PackageDir
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'
Import-Module (Join-Path $PSScriptRoot 'kstack-common.psm1') -Force

$package = Resolve-KStackPackage -PackageDir $PackageDir -ScriptRoot $PSScriptRoot

$certificates = @(Get-ChildItem -Path Cert:\LocalMachine\My | Where-Object { $_.HasPrivateKey })
if ($Thumbprint) {
    $certificates = @($certificates | Where-Object { $_.Thumbprint -eq $Thumbprint })
} else {
    $certificates = @($certificates | Where-Object { $_.Subject -eq $Subject -and $_.NotAfter -gt (Get-Date) })
}
if ($certificates.Count -eq 0) {
    throw 'No signing certificate with a private key in Cert:\LocalMachine\My: run install-test-certificate.ps1 first.'
}
$certificate = $certificates | Sort-Object -Property NotAfter -Descending | Select-Object -First 1
Write-Host ('Signing with {0} ({1}).' -f $certificate.Thumbprint, $certificate.Subject)

if (-not $SignTool) {
    $onPath = Get-Command -Name 'signtool.exe' -ErrorAction SilentlyContinue
    if ($onPath) {
        $SignTool = $onPath.Source
    } else {
        $kits = Join-Path ${env:ProgramFiles(x86)} 'Windows Kits\10\bin'
        $found = Get-ChildItem -Path $kits -Filter 'signtool.exe' -Recurse -ErrorAction SilentlyContinue |
            Where-Object { $_.Directory.Name -eq 'x64' } |
            Sort-Object -Property FullName -Descending |
            Select-Object -First 1
        if ($found) {
            $SignTool = $found.FullName
        }
    }
}

$files = @(Join-Path $package 'kstack.sys')
$catalog = Join-Path $package 'kstack.cat'
if (Test-Path -LiteralPath $catalog) {
    $files += $catalog
}

foreach ($file in $files) {
    if ($SignTool) {
        $arguments = @('sign', '/fd', 'SHA256', '/sm', '/s', 'My', '/sha1', $certificate.Thumbprint, $file)
        Write-Host ('> signtool.exe {0}' -f ($arguments -join ' '))
        $result = Invoke-Native -FilePath $SignTool -Arguments $arguments
        if ($result.ExitCode -ne 0) {
            throw ("signtool sign failed for {0} ({1}):`n{2}" -f $file, $result.ExitCode, $result.Text)
        }
    } elseif ($file -like '*.sys') {
        $signature = Set-AuthenticodeSignature -FilePath $file -Certificate $certificate -HashAlgorithm SHA256
        if ($signature.Status -ne 'Valid') {
            throw ('Set-AuthenticodeSignature left {0} with status {1}: {2}' -f $file, $signature.Status, $signature.StatusMessage)
        }
    } else {
        Write-Warning ('No signtool.exe: {0} stays as it is (only the INF route, pnputil, needs it signed).' -f $file)
        continue
    }
    $check = Get-AuthenticodeSignature -FilePath $file
    $signer = 'no signer'
    if ($check.SignerCertificate) {
        $signer = $check.SignerCertificate.Subject
    }
    Write-Host ('{0}: {1} ({2})' -f (Split-Path -Leaf $file), $check.Status, $signer)
    if ($check.Status -ne 'Valid') {
        Write-Warning 'The signature does not verify on this machine: is the certificate in Root and TrustedPublisher (install-test-certificate.ps1)?'
    }
}
Write-Host 'Next: kstack-service.ps1 -Action create, then -Action start.'

#Requires -RunAsAdministrator
<#
.SYNOPSIS
    Makes a test code-signing certificate (or takes one from a .cer file) and
    trusts it on this machine, so a kstack.sys signed with it loads in test
    mode and verifies.

.DESCRIPTION
    Without -CertificateFile: finds or creates a self-signed code-signing
    certificate with the subject -Subject in Cert:\LocalMachine\My (with its
    private key, for sign-driver.ps1), exports its public part to
    -ExportPath, and imports that into Cert:\LocalMachine\Root and
    Cert:\LocalMachine\TrustedPublisher.

    With -CertificateFile: only imports that certificate into the same two
    stores. Use it for a package built on Windows with `cargo make`, which
    is already test-signed by wdk-build's WDRLocalTestCert and carries
    WDRLocalTestCert.cer.

    Trusting a certificate in Root lets it vouch for anything: do this only
    on a test VM.

.PARAMETER Subject
    The certificate's subject (default: CN=kstack test signing).

.PARAMETER ExportPath
    Where to write the public certificate (default: kstack-test.cer in the
    package folder).

.PARAMETER CertificateFile
    Trust this .cer file instead of making a certificate.

.PARAMETER PackageDir
    The package folder (default: the folder above this script, else the
    repository's target\kstack-package).

.EXAMPLE
    .\install-test-certificate.ps1

.EXAMPLE
    .\install-test-certificate.ps1 -CertificateFile C:\kstack\WDRLocalTestCert.cer
#>
[CmdletBinding(DefaultParameterSetName = 'Create')]
param(
    [Parameter(ParameterSetName = 'Create')]
    [string] $Subject = 'CN=kstack test signing',
    [Parameter(ParameterSetName = 'Create')]
    [string] $ExportPath,
    [Parameter(ParameterSetName = 'Import', Mandatory = $true)]
    [string] $CertificateFile,
    [string] $PackageDir
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'
Import-Module (Join-Path $PSScriptRoot 'kstack-common.psm1') -Force

if ($PSCmdlet.ParameterSetName -eq 'Create') {
    $codeSigning = '1.3.6.1.5.5.7.3.3'
    $certificate = Get-ChildItem -Path Cert:\LocalMachine\My |
        Where-Object {
            $_.Subject -eq $Subject -and $_.HasPrivateKey -and $_.NotAfter -gt (Get-Date) -and
            ($_.EnhancedKeyUsageList | Where-Object { $_.ObjectId -eq $codeSigning })
        } |
        Sort-Object -Property NotAfter -Descending |
        Select-Object -First 1
    if ($certificate) {
        Write-Host ('Using the existing certificate {0} ({1}).' -f $certificate.Thumbprint, $Subject)
    } else {
        $certificate = New-SelfSignedCertificate -Type CodeSigningCert -Subject $Subject `
            -CertStoreLocation Cert:\LocalMachine\My -KeyAlgorithm RSA -KeyLength 2048 `
            -HashAlgorithm SHA256 -NotAfter (Get-Date).AddYears(2)
        Write-Host ('Created the certificate {0} ({1}) in Cert:\LocalMachine\My.' -f $certificate.Thumbprint, $Subject)
    }
    if (-not $ExportPath) {
        $ExportPath = Join-Path (Resolve-KStackPackage -PackageDir $PackageDir -ScriptRoot $PSScriptRoot) 'kstack-test.cer'
    }
    Export-Certificate -Cert $certificate -FilePath $ExportPath -Type CERT | Out-Null
    Write-Host ('Exported its public part to {0}.' -f $ExportPath)
    $CertificateFile = $ExportPath
}

foreach ($store in @('Cert:\LocalMachine\Root', 'Cert:\LocalMachine\TrustedPublisher')) {
    $imported = Import-Certificate -FilePath $CertificateFile -CertStoreLocation $store
    Write-Host ('Trusted {0} in {1}.' -f $imported.Thumbprint, $store)
}
Write-Host 'Next: sign-driver.ps1 (and enable-test-signing.ps1 if you have not yet).'
